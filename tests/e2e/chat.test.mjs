// End-to-end: two matrix-js-sdk clients against a real Atrium server (ATRIUM_URL).
// They register, log in, create a room, invite, join and talk through startClient() sync;
// one restarts from the sync token its store saved and receives what it missed; logout
// invalidates the token. Run by tests/integration/test_e2e_jssdk.py, which starts the server.
import { test } from "node:test";
import assert from "node:assert/strict";
import "fake-indexeddb/auto";
import * as sdk from "matrix-js-sdk";

const base = process.env.ATRIUM_URL;
const WAIT_MS = 20000;

// Quiet the SDK's own logging; failures are reported by assertions.
sdk.logger?.setLevel?.("warn");
sdk.logger?.disableAll?.();

function waitFor(what, check, emitter, events) {
    return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
            cleanup();
            reject(new Error(`timed out waiting for ${what}`));
        }, WAIT_MS);
        const listener = (...args) => {
            let value;
            try {
                value = check(...args);
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
            for (const ev of events) emitter.removeListener(ev, listener);
        }
        for (const ev of events) emitter.on(ev, listener);
        listener(); // it may already be true
    });
}

async function account(name) {
    const anon = sdk.createClient({ baseUrl: base });
    const password = `pw-${name}-secret`;
    await anon.registerRequest({ username: name, password, auth: { type: "m.login.dummy" } });
    const login = await anon.loginRequest({
        type: "m.login.password",
        identifier: { type: "m.id.user", user: name },
        password,
    });
    return login;
}

// A client whose store persists (fake IndexedDB, alive for this process) and whose
// requests are recorded, so a test can see what it asked the server.
async function startClient(login, dbName, requests) {
    const store = new sdk.IndexedDBStore({ indexedDB: globalThis.indexedDB, dbName });
    await store.startup();
    const client = sdk.createClient({
        baseUrl: base,
        accessToken: login.access_token,
        userId: login.user_id,
        deviceId: login.device_id,
        store,
        fetchFn: (url, init) => {
            requests?.push(String(url));
            return fetch(url, init);
        },
    });
    await client.startClient({ initialSyncLimit: 20, lazyLoadMembers: true });
    await waitFor("the first sync", () => ["PREPARED", "SYNCING"].includes(client.getSyncState()),
        client, [sdk.ClientEvent.Sync]);
    return client;
}

function bodiesIn(client, roomId) {
    const room = client.getRoom(roomId);
    if (!room) return [];
    return room.getLiveTimeline().getEvents()
        .filter((e) => e.getType() === "m.room.message")
        .map((e) => e.getContent().body);
}

function waitForBody(client, roomId, body) {
    return waitFor(`"${body}" at ${client.getUserId()}`, () => bodiesIn(client, roomId).includes(body),
        client, [sdk.RoomEvent.Timeline, sdk.ClientEvent.Room]);
}

test("two clients talk, one restarts from its stored sync token, logout invalidates", async () => {
    const suffix = Math.random().toString(36).slice(2, 8);
    const aliceLogin = await account(`alice${suffix}`);
    const bobLogin = await account(`bob${suffix}`);
    const alice = await startClient(aliceLogin, `alice-${suffix}`);
    let bob = await startClient(bobLogin, `bob-${suffix}`);

    const { room_id: roomId } = await alice.createRoom({
        name: "E2E room", preset: "private_chat", invite: [bobLogin.user_id],
    });
    await waitFor("bob's invite", () => bob.getRoom(roomId)?.getMyMembership() === "invite",
        bob, [sdk.ClientEvent.Room, sdk.RoomEvent.MyMembership]);
    await bob.joinRoom(roomId);
    // A late sync of alice's may bring the room and bob's join at once: the SDK adds a new
    // room's timeline before it stores the room, so the check runs again when it does.
    await waitFor("bob joined, seen by alice",
        () => alice.getRoom(roomId)?.getMember(bobLogin.user_id)?.membership === "join",
        alice, [sdk.RoomEvent.Timeline, sdk.ClientEvent.Room]);

    await alice.sendTextMessage(roomId, "hello bob");
    await waitForBody(bob, roomId, "hello bob");
    await bob.sendTextMessage(roomId, "hello alice");
    await waitForBody(alice, roomId, "hello alice");

    // Bob goes away; alice writes; bob comes back from the token his store saved.
    await bob.store.save(true);
    bob.stopClient();
    for (const n of [1, 2, 3]) await alice.sendTextMessage(roomId, `missed ${n}`);
    const requests = [];
    bob = await startClient(bobLogin, `bob-${suffix}`, requests);
    for (const n of [1, 2, 3]) await waitForBody(bob, roomId, `missed ${n}`);
    const firstSync = requests.find((u) => u.includes("/sync"));
    assert.ok(firstSync && /[?&]since=/.test(firstSync),
        `the restarted client resumed from a stored token: ${firstSync}`);
    bob.stopClient();

    // Logout: the token stops working at once.
    alice.stopClient();
    await alice.logout(true);
    const who = await fetch(`${base}/_matrix/client/v3/account/whoami`, {
        headers: { Authorization: `Bearer ${aliceLogin.access_token}` },
    });
    assert.equal(who.status, 401);
    assert.equal((await who.json()).errcode, "M_UNKNOWN_TOKEN");
});
