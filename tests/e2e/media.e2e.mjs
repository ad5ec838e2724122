// End-to-end media with matrix-js-sdk against a real Atrium server (ATRIUM_URL) that has
// the media plugin: uploadContent, then the download and thumbnail URLs the SDK builds for
// authenticated media (mxcUrlToHttp with useAuthentication), fetched with the access token
// the way Element's service worker does. MEDIA_E2E_PNG names a PNG to upload (written by
// tests/integration/test_media_jssdk.py, which starts the server and runs this file).
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as sdk from "matrix-js-sdk";

const base = process.env.ATRIUM_URL;
const image = readFileSync(process.env.MEDIA_E2E_PNG);

sdk.logger?.setLevel?.("warn");
sdk.logger?.disableAll?.();

async function loggedInClient(name) {
    const anon = sdk.createClient({ baseUrl: base });
    const password = `pw-${name}-secret`;
    await anon.registerRequest({ username: name, password, auth: { type: "m.login.dummy" } });
    const login = await anon.loginRequest({
        type: "m.login.password",
        identifier: { type: "m.id.user", user: name },
        password,
    });
    const client = sdk.createClient({
        baseUrl: base,
        accessToken: login.access_token,
        userId: login.user_id,
        deviceId: login.device_id,
    });
    return { client, token: login.access_token };
}

test("uploadContent, then download and thumbnail through the SDK's authenticated media URLs", async () => {
    const { client, token } = await loggedInClient(`media${Date.now()}`);
    assert.ok(await client.isVersionSupported("v1.11"), "the server advertises authenticated media");
    const config = await client.getMediaConfig();
    assert.equal(typeof config["m.upload.size"], "number");

    const uploaded = await client.uploadContent(new Blob([image], { type: "image/png" }), {
        name: "pixel art.png",
        type: "image/png",
    });
    assert.match(uploaded.content_uri, /^mxc:\/\/[^/]+\/[A-Za-z0-9_-]+$/);
    const auth = { headers: { Authorization: `Bearer ${token}` } };

    const download = client.mxcUrlToHttp(uploaded.content_uri, undefined, undefined, undefined,
        false, true, true);
    assert.match(download, /\/_matrix\/client\/v1\/media\/download\//);
    let res = await fetch(download, auth);
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("content-type"), "image/png");
    assert.equal(res.headers.get("content-disposition"), 'inline; filename="pixel art.png"');
    assert.deepEqual(Buffer.from(await res.arrayBuffer()), image);

    const thumbnail = client.mxcUrlToHttp(uploaded.content_uri, 96, 96, "crop", false, true, true);
    assert.match(thumbnail, /\/_matrix\/client\/v1\/media\/thumbnail\/.*width=96&height=96&method=crop/);
    res = await fetch(thumbnail, auth);
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("content-type"), "image/webp");
    const webp = Buffer.from(await res.arrayBuffer());
    assert.equal(webp.subarray(0, 4).toString(), "RIFF");
    assert.equal(webp.subarray(8, 12).toString(), "WEBP");

    res = await fetch(thumbnail); // no token: the URL alone is not enough
    assert.equal(res.status, 401);
    assert.equal((await res.json()).errcode, "M_MISSING_TOKEN");
});
