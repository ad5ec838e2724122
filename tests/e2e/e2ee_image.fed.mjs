// End-to-end across two servers: an encrypted image. Alice (on ATRIUM_A_URL) and Bob (on
// ATRIUM_B_URL), each a matrix-js-sdk client with the SDK's Rust crypto (initRustCrypto,
// @matrix-org/matrix-sdk-crypto-wasm), share an encrypted room created on A. Alice
// encrypts an image as the spec's attachments are encrypted (AES-CTR-256, a JWK key, the
// SHA-256 of the ciphertext), uploads the ciphertext and sends m.image with `file`; Bob's
// client decrypts the event, downloads the file through his own server (a remote fetch
// from A over federation media), checks its hash, decrypts it and compares it with the
// original. Run by tests/integration/test_e2ee_image_jssdk.py, which starts both servers
// (B is Atrium or, in the interop test, Synapse).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createHash, webcrypto } from "node:crypto";
import "fake-indexeddb/auto";
import * as sdk from "matrix-js-sdk";

const A = process.env.ATRIUM_A_URL, B = process.env.ATRIUM_B_URL;
const IMAGE = readFileSync(process.env.E2EE_IMAGE_PATH);
const WAIT_MS = 60000;

// The Rust crypto's tracing (turned on at debug by initRustCrypto) and the SDK's request
// log write to the console; warnings and errors still show.
for (const level of ["log", "info", "debug", "trace"]) console[level] = () => {};
// The SDK's call-session manager reports every state event of a room it has not met yet
// (the invite's) as an error: noise here.
for (const level of ["warn", "error"]) {
    const write = console[level].bind(console);
    console[level] = (first, ...rest) => {
        if (!String(first).startsWith("[MatrixRTCSessionManager]")) write(first, ...rest);
    };
}
sdk.logger?.setLevel?.("warn"); // after the console is set: the logger binds its methods

function waitFor(what, check, emitter, events) {
    return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
            cleanup();
            reject(new Error(`timed out waiting for ${what}`));
        }, WAIT_MS);
        const poll = setInterval(() => listener(), 250);
        const listener = () => {
            let value;
            try {
                value = check();
            } catch (e) {
                cleanup();
                reject(e);
                return;
            }
            if (value) {
                cleanup();
                resolve(value);
            }
        };
        function cleanup() {
            clearTimeout(timer);
            clearInterval(poll);
            for (const ev of events) emitter.removeListener(ev, listener);
        }
        for (const ev of events) emitter.on(ev, listener);
        listener();
    });
}

async function login(base, name) {
    const anon = sdk.createClient({ baseUrl: base });
    const password = `pw-${name}-secret`;
    await anon.registerRequest({ username: name, password, auth: { type: "m.login.dummy" } });
    return anon.loginRequest({
        type: "m.login.password",
        identifier: { type: "m.id.user", user: name },
        password,
    });
}

async function cryptoClient(base, creds) {
    const client = sdk.createClient({
        baseUrl: base,
        accessToken: creds.access_token,
        userId: creds.user_id,
        deviceId: creds.device_id,
    });
    await client.initRustCrypto({ useIndexedDB: false });
    await client.startClient({ initialSyncLimit: 20 });
    await waitFor("the first sync", () => ["PREPARED", "SYNCING"].includes(client.getSyncState()),
        client, [sdk.ClientEvent.Sync]);
    return client;
}

const b64 = (buf) => Buffer.from(buf).toString("base64").replace(/=+$/, "");
const b64url = (buf) => b64(buf).replace(/\+/g, "-").replace(/\//g, "_");
const sha256 = (buf) => createHash("sha256").update(buf).digest();

// The attachment format of the spec's "Sending encrypted attachments": AES-CTR with a
// 256-bit key, a 128-bit counter block whose low 64 bits start at zero.
async function encryptAttachment(plain) {
    const key = await webcrypto.subtle.generateKey({ name: "AES-CTR", length: 256 }, true,
        ["encrypt", "decrypt"]);
    const iv = new Uint8Array(16);
    webcrypto.getRandomValues(iv.subarray(0, 8));
    const cipher = Buffer.from(await webcrypto.subtle.encrypt(
        { name: "AES-CTR", counter: iv, length: 64 }, key, plain));
    const jwk = await webcrypto.subtle.exportKey("jwk", key);
    return {
        cipher,
        file: {
            v: "v2",
            key: { kty: "oct", key_ops: ["encrypt", "decrypt"], alg: "A256CTR", k: jwk.k, ext: true },
            iv: b64(iv),
            hashes: { sha256: b64(sha256(cipher)) },
        },
    };
}

async function decryptAttachment(cipher, file) {
    assert.equal(b64(sha256(cipher)), file.hashes.sha256, "the ciphertext's SHA-256");
    const key = await webcrypto.subtle.importKey("jwk", file.key, { name: "AES-CTR" }, false,
        ["decrypt"]);
    const iv = Buffer.from(file.iv, "base64");
    return Buffer.from(await webcrypto.subtle.decrypt(
        { name: "AES-CTR", counter: iv, length: 64 }, key, cipher));
}

test("an encrypted image sent on A is decrypted by a user of B, fetched through B", async () => {
    assert.ok(A && B, "ATRIUM_A_URL and ATRIUM_B_URL are required");
    const alice = await cryptoClient(A, await login(A, "alice"));
    // B_CREDS: bob's login on a server whose /register is closed (a Synapse peer).
    const bobCreds = process.env.B_CREDS ? JSON.parse(process.env.B_CREDS) : await login(B, "bob");
    const bob = await cryptoClient(B, bobCreds);
    try {
        const { room_id: roomId } = await alice.createRoom({
            name: "Pictures",
            invite: [bob.getUserId()],
            initial_state: [{
                type: "m.room.encryption", state_key: "",
                content: { algorithm: "m.megolm.v1.aes-sha2" },
            }],
        });
        await waitFor("bob's invite", () => bob.getRoom(roomId)?.getMyMembership() === "invite",
            bob, [sdk.ClientEvent.Room, sdk.RoomEvent.MyMembership]);
        await bob.joinRoom(roomId);
        await waitFor("bob joined, as alice sees it",
            () => alice.getRoom(roomId)?.getMember(bob.getUserId())?.membership === "join",
            alice, [sdk.RoomStateEvent.Members, sdk.ClientEvent.Room]); /* a new room is stored after its events */
        assert.ok(await alice.getCrypto().isEncryptionEnabledInRoom(roomId));

        const { cipher, file } = await encryptAttachment(IMAGE);
        const { content_uri: url } = await alice.uploadContent(cipher, {
            type: "application/octet-stream", includeFilename: false,
        });
        assert.match(url, /^mxc:\/\//);
        const { event_id: eventId } = await alice.sendMessage(roomId, {
            msgtype: "m.image",
            body: "picture.png",
            file: { ...file, url },
            info: { mimetype: "image/png", size: IMAGE.length },
        });

        const event = await waitFor("the image, decrypted, at bob", () => {
            const ev = bob.getRoom(roomId)?.findEventById(eventId);
            return ev && !ev.isBeingDecrypted() && ev.getType() === "m.room.message" ? ev : null;
        }, bob, [sdk.RoomEvent.Timeline, sdk.MatrixEventEvent.Decrypted]);
        assert.equal(event.getWireType(), "m.room.encrypted", "it crossed encrypted");
        assert.equal(event.isDecryptionFailure(), false);
        const content = event.getContent();
        assert.equal(content.msgtype, "m.image");
        assert.equal(content.file.url, url);

        // Through bob's own server: authenticated media, a remote fetch from A.
        const httpUrl = bob.mxcUrlToHttp(content.file.url, undefined, undefined, undefined,
            false, true, true);
        assert.ok(httpUrl.startsWith(B), httpUrl);
        const resp = await fetch(httpUrl, { headers: { Authorization: `Bearer ${bobCreds.access_token}` } });
        assert.equal(resp.status, 200);
        const fetched = Buffer.from(await resp.arrayBuffer());
        assert.equal(fetched.length, cipher.length);
        const plain = await decryptAttachment(fetched, content.file);
        assert.equal(sha256(plain).toString("hex"), sha256(IMAGE).toString("hex"));
        assert.ok(!fetched.equals(IMAGE), "what the servers carried was the ciphertext");
    } finally {
        alice.stopClient();
        bob.stopClient();
    }
});
