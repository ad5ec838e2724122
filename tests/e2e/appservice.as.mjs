// Application services built with the real npm libraries against a running Atrium
// (driven by tests/integration/test_appservice.py, BridgeLibrariesTest, which registered
// both services in the server's configuration and passes their ports and a user here):
// a bridge on matrix-appservice-bridge's Bridge takes transactions and talks back; an
// appservice on matrix-bot-sdk's Appservice answers the server's user query (it makes the
// user there and then) and sends a message as that ghost.
import { test } from "node:test";
import assert from "node:assert/strict";

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
    const seen = [];
    const registration = new AppServiceRegistration(`http://127.0.0.1:${env("MAB_PORT")}`);
    registration.setId("mab");
    registration.setHomeserverToken("mab-hs");
    registration.setAppServiceToken("mab-as");
    registration.setSenderLocalpart("mabbot");
    registration.addRegexPattern("users", "@mab_.*", true);
    const bridge = new Bridge({
        homeserverUrl: HS,
        domain: DOMAIN,
        registration,
        disableStores: true,
        controller: { onUserQuery: () => ({}), onEvent: (request) => seen.push(request.getData()) },
    });
    await bridge.run(Number(env("MAB_PORT")), undefined, "127.0.0.1");

    // A transaction reaches the bridge: the invite of its bot, then a message once it joined.
    const created = await api("POST", `${V3}/createRoom`, { invite: [bot] });
    assert.equal(created.status, 200, JSON.stringify(created.json));
    const room = created.json.room_id;
    await until("the bridge's invite", () =>
        seen.some((e) => e.type === "m.room.member" && e.state_key === bot &&
                         e.content.membership === "invite" && e.room_id === room));
    await bridge.getIntent().join(room);
    assert.equal((await api("PUT", `${V3}/rooms/${encodeURIComponent(room)}/send/m.room.message/t1`,
                            { msgtype: "m.text", body: "hello bridge" })).status, 200);
    await until("the message at the bridge", () =>
        seen.some((e) => e.type === "m.room.message" && e.content.body === "hello bridge"));
    await bridge.getIntent().sendText(room, "hello from the bridge");

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
    appservice.stop();
    await bridge.close?.();
});
