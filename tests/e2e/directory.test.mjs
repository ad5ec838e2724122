// End-to-end: matrix-js-sdk and the room directory (directory.so) on a real Atrium server
// (ATRIUM_URL): createRoom({room_alias_name, visibility: "public"}), getRoomIdForAlias,
// publicRooms({server}) naming this server, joinRoom by alias, deleteAlias. Run by
// tests/integration/test_e2e_jssdk.py, which starts the server with the directory enabled.
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

test("a public room with an alias is found by alias and in the public room list", async () => {
    const owner = await client("dirowner");
    const guest = await client("dirguest");
    const server = owner.getUserId().split(":").slice(1).join(":");
    const { room_id: roomId } = await owner.createRoom({
        room_alias_name: "jssdk-lobby",
        visibility: "public",
        name: "SDK lobby",
    });
    const alias = `#jssdk-lobby:${server}`;
    const found = await guest.getRoomIdForAlias(alias);
    assert.equal(found.room_id, roomId);
    assert.deepEqual(found.servers, [server]);

    const list = await guest.publicRooms({ server, limit: 10 });
    const entry = list.chunk.find((r) => r.room_id === roomId);
    assert.ok(entry, "the room is listed");
    assert.equal(entry.name, "SDK lobby");
    assert.equal(entry.canonical_alias, alias);
    const searched = await guest.publicRooms({ server, filter: { generic_search_term: "sdk lob" } });
    assert.deepEqual(searched.chunk.map((r) => r.room_id), [roomId]);

    const joined = await guest.joinRoom(alias);
    assert.equal(joined.roomId, roomId);
    await owner.deleteAlias(alias);
    await assert.rejects(guest.getRoomIdForAlias(alias), (e) => e.errcode === "M_NOT_FOUND");
});
