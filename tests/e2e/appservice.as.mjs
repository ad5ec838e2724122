// Application services built with the real npm libraries against a running Atrium
// (driven by tests/integration/test_appservice.py, BridgeLibrariesTest, which registered
// both services in the server's configuration and passes their ports and a user here):
// a bridge on matrix-appservice-bridge's Bridge takes transactions and talks back with a
// matrix-js-sdk user, checks the homeserver-to-bridge route with its self-ping, gets typing
// (it asked for ephemeral events) and makes a room when a client joins an unknown alias of
// its namespace; an appservice on matrix-bot-sdk's Appservice answers the server's user
// query (it makes the user there and then), sends a message as that ghost, and gets no
// typing (it did not ask).
import { test } from "node:test";
import assert from "node:assert/strict";

import * as sdk from "matrix-js-sdk";
import { AppServiceRegistration, Bridge } from "matrix-appservice-bridge";
import { Appservice, MemoryStorageProvider } from "matrix-bot-sdk";

const env = (k) => {
    const v = process.env[k];
    if (!v) throw new Error(`${k} is not set (run through test_appservice.py)`);
    return v;
};
const HS = env("ATRIUM_URL");
const DOMAIN = env("ATRIUM_DOMAIN");
const ALICE = env("ALICE_TOKEN");
const ALICE_ID = env("ALICE_ID");
const V3 = "/_matrix/client/v3";

async function api(method, path, body) {
    const res = await fetch(HS + path, {
        method,
        headers: { "Content-Type": "application/json", Authorization: `Bearer ${ALICE}` },
        body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: res.status, json: await res.json().catch(() => ({})) };
}

async function until(what, fn, ms = 20000) {
    const end = Date.now() + ms;
    for (;;) {
        const v = await fn();
        if (v) return v;
        if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
        await new Promise((r) => setTimeout(r, 50));
    }
}

async function messages(room) {
    const r = await api("GET", `${V3}/rooms/${encodeURIComponent(room)}/messages?dir=b&limit=50`);
    assert.equal(r.status, 200, JSON.stringify(r.json));
    return r.json.chunk.filter((e) => e.type === "m.room.message");
}

test("a matrix-appservice-bridge bridge and a matrix-bot-sdk appservice", async () => {
    const bot = `@mabbot:${DOMAIN}`;
    const seen = [], typing = [], aliases = [];
    const registration = new AppServiceRegistration(`http://127.0.0.1:${env("MAB_PORT")}`);
    registration.setId("mab");
    registration.setHomeserverToken("mab-hs");
    registration.setAppServiceToken("mab-as");
    registration.setSenderLocalpart("mabbot");
    registration.addRegexPattern("users", "@mab_.*", true);
    registration.addRegexPattern("aliases", "#mab_.*", true);
    registration.pushEphemeral = true;
    const bridge = new Bridge({
        homeserverUrl: HS,
        domain: DOMAIN,
        registration,
        disableStores: true,
        controller: {
            onUserQuery: () => ({}),
            onEvent: (request) => seen.push(request.getData()),
            onEphemeralEvent: (request) => typing.push(request.getData()),
            onAliasQuery: (alias, localpart) => {
                aliases.push(alias);
                return { creationOpts: { preset: "public_chat", name: "Made by the bridge",
                                         room_alias_name: localpart } };
            },
        },
    });
    await bridge.run(Number(env("MAB_PORT")), undefined, "127.0.0.1");

    // A transaction reaches the bridge: the invite of its bot, then a message once it joined.
    const alice = sdk.createClient({ baseUrl: HS, accessToken: ALICE, userId: ALICE_ID });
    const { room_id: room } = await alice.createRoom({ invite: [bot] });
    await until("the bridge's invite", () =>
        seen.some((e) => e.type === "m.room.member" && e.state_key === bot &&
                         e.content.membership === "invite" && e.room_id === room));
    await bridge.getIntent().join(room);
    await alice.sendTextMessage(room, "hello bridge");
    await until("the message at the bridge", () =>
        seen.some((e) => e.type === "m.room.message" && e.content.body === "hello bridge"));
    await bridge.getIntent().sendText(room, "hello from the bridge");
    // The bridge's self-ping: an event its bot sends comes back in a transaction.
    const delay = await bridge.pingAppserviceRoute(room, 15000);
    assert.ok(delay >= 0 && delay < 15000, `ping delay ${delay}`);
    // Typing reaches the bridge, which asked for ephemeral events.
    await alice.sendTyping(room, true, 10000);
    await until("alice's typing at the bridge", () =>
        typing.some((e) => e.type === "m.typing" && e.room_id === room &&
                           (e.content.user_ids || []).includes(ALICE_ID)));
    // Joining an unknown alias of the bridge's namespace: the server asks the bridge, which
    // makes the room; the join then goes through.
    const alias = `#mab_lobby:${DOMAIN}`;
    const joined = await alice.joinRoom(alias).catch((err) => {
        throw new Error(`joining ${alias} (the bridge was asked about ${JSON.stringify(aliases)}): ${err}`);
    });
    assert.deepEqual(aliases, [alias]);
    const lobbyName = await api("GET", `${V3}/rooms/${encodeURIComponent(joined.roomId)}/state/m.room.name`);
    assert.equal(lobbyName.json.name, "Made by the bridge");

    // The bot SDK's appservice makes a ghost when the server asks about it.
    const queried = [];
    const appservice = new Appservice({
        port: Number(env("SDK_PORT")),
        bindAddress: "127.0.0.1",
        homeserverName: DOMAIN,
        homeserverUrl: HS,
        storage: new MemoryStorageProvider(),
        registration: {
            id: "sdk", as_token: "sdk-as", hs_token: "sdk-hs", sender_localpart: "sdkbot",
            namespaces: { users: [{ exclusive: true, regex: "@sdk_.*" }], rooms: [], aliases: [] },
            rate_limited: false,
        },
    });
    appservice.on("query.user", (userId, createUser) => {
        queried.push(userId);
        createUser({ display_name: "A ghost" });
    });
    const sdkEphemeral = [];
    appservice.on("ephemeral.event", (ev) => sdkEphemeral.push(ev));
    await appservice.begin();
    const ghost = `@sdk_ghost:${DOMAIN}`;
    const profile = await api("GET", `${V3}/profile/${encodeURIComponent(ghost)}`);
    assert.equal(profile.status, 200, JSON.stringify(profile.json));
    assert.equal(profile.json.displayname, "A ghost");
    assert.deepEqual(queried, [ghost]);
    assert.equal((await api("POST", `${V3}/rooms/${encodeURIComponent(room)}/invite`,
                            { user_id: ghost })).status, 200);
    const intent = appservice.getIntentForUserId(ghost);
    await intent.joinRoom(room);
    await intent.sendText(room, "hello from a ghost");

    const got = await messages(room);
    assert.ok(got.some((e) => e.sender === ghost && e.content.body === "hello from a ghost"));
    assert.ok(got.some((e) => e.sender === bot && e.content.body === "hello from the bridge"));
    // The ghost's appservice did not ask for ephemeral events: typing in its room reaches
    // the bridge (which asked) and not it.
    const before = typing.length;
    await alice.sendTyping(room, true, 10000);
    await until("the second typing at the bridge", () => typing.length > before);
    await new Promise((r) => setTimeout(r, 500));
    assert.deepEqual(sdkEphemeral, []);
    alice.stopClient();
    appservice.stop();
    await bridge.close?.();
});
