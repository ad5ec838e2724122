// End-to-end: matrix-js-sdk's "jump to date" (timestampToEvent, the stable v1 endpoint)
// and its reports (reportEvent, reportRoom) on a real Atrium server (ATRIUM_URL). Run by
// tests/integration/test_e2e_jssdk.py.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as sdk from "matrix-js-sdk";

const base = process.env.ATRIUM_URL;

sdk.logger?.setLevel?.("warn");
sdk.logger?.disableAll?.();

async function client(name) {
    const anon = sdk.createClient({ baseUrl: base });
    const password = `pw-${name}-secret`;
    await anon.registerRequest({ username: name, password, auth: { type: "m.login.dummy" } });
    const login = await anon.loginRequest({
        type: "m.login.password",
        identifier: { type: "m.id.user", user: name },
        password,
    });
    return sdk.createClient({ baseUrl: base, accessToken: login.access_token, userId: login.user_id });
}

test("the SDK jumps to a date and reports an event and a room", async () => {
    const alice = await client("jumpalice");
    const { room_id: roomId } = await alice.createRoom({ name: "Dates" });
    const { event_id: first } = await alice.sendMessage(roomId, { msgtype: "m.text", body: "one" });
    await new Promise((resolve) => setTimeout(resolve, 20));
    const { event_id: second } = await alice.sendMessage(roomId, { msgtype: "m.text", body: "two" });
    const firstTs = (await alice.fetchRoomEvent(roomId, first)).origin_server_ts;

    const back = await alice.timestampToEvent(roomId, firstTs, sdk.Direction.Backward);
    assert.deepEqual(back, { event_id: first, origin_server_ts: firstTs });
    const forward = await alice.timestampToEvent(roomId, firstTs + 1, sdk.Direction.Forward);
    assert.equal(forward.event_id, second);
    await assert.rejects(alice.timestampToEvent(roomId, Date.now() + 3600000, sdk.Direction.Forward),
        (e) => e.errcode === "M_NOT_FOUND");

    assert.deepEqual(await alice.reportEvent(roomId, second, -50, "testing reports"), {});
    assert.deepEqual(await alice.reportRoom(roomId, "testing room reports"), {});
    await assert.rejects(alice.reportEvent(roomId, "$missing", -50, "x"), (e) => e.errcode === "M_NOT_FOUND");
});
