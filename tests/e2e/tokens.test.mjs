// End-to-end: matrix-js-sdk's refresh tokens (loginRequest with refresh_token: true, then
// refreshToken) and signing in a second device (requestLoginToken through its password
// UIA, then loginWithToken) on a real Atrium server (ATRIUM_URL), whose test run turns on
// auth.login_via_existing_session. Run by tests/integration/test_e2e_jssdk.py.
import { test } from "node:test";
import assert from "node:assert/strict";
import * as sdk from "matrix-js-sdk";

const base = process.env.ATRIUM_URL;

sdk.logger?.setLevel?.("warn");
sdk.logger?.disableAll?.();

async function account(name) {
    const anon = sdk.createClient({ baseUrl: base });
    const password = `pw-${name}-secret`;
    await anon.registerRequest({ username: name, password, auth: { type: "m.login.dummy" } });
    return { anon, name, password };
}

test("the SDK refreshes its access token and the old pair stops working", async () => {
    const { anon, name, password } = await account("refresher");
    const login = await anon.loginRequest({
        type: "m.login.password",
        identifier: { type: "m.id.user", user: name },
        password,
        refresh_token: true,
    });
    assert.equal(typeof login.refresh_token, "string");
    assert.ok(login.expires_in_ms > 0);
    const first = sdk.createClient({ baseUrl: base, accessToken: login.access_token, userId: login.user_id });
    const next = await first.refreshToken(login.refresh_token);
    assert.notEqual(next.access_token, login.access_token);
    const second = sdk.createClient({ baseUrl: base, accessToken: next.access_token, userId: login.user_id });
    assert.equal((await second.whoami()).device_id, login.device_id);
    await assert.rejects(first.whoami(), (e) => e.errcode === "M_UNKNOWN_TOKEN");
    await assert.rejects(anon.refreshToken(login.refresh_token), (e) => e.errcode === "M_UNKNOWN_TOKEN");
});

test("the SDK gets a login token and signs in a second device with it once", async () => {
    const { anon, name, password } = await account("twodevices");
    const login = await anon.loginWithPassword(name, password);
    const phone = sdk.createClient({ baseUrl: base, accessToken: login.access_token, userId: login.user_id });
    const caps = await phone.getCapabilities();
    assert.deepEqual(caps["m.get_login_token"], { enabled: true });
    let session;
    await assert.rejects(phone.requestLoginToken(), (e) => {
        session = e.data?.session;
        return e.httpStatus === 401 && typeof session === "string";
    });
    const got = await phone.requestLoginToken({
        type: "m.login.password", session, password, identifier: { type: "m.id.user", user: name },
    });
    assert.equal(typeof got.login_token, "string");
    const laptop = sdk.createClient({ baseUrl: base });
    const second = await laptop.loginWithToken(got.login_token);
    assert.equal(second.user_id, login.user_id);
    assert.notEqual(second.device_id, login.device_id);
    await assert.rejects(sdk.createClient({ baseUrl: base }).loginWithToken(got.login_token),
        (e) => e.errcode === "M_FORBIDDEN");
});
