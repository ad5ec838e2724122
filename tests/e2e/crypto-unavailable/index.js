// Stands in for @matrix-org/matrix-sdk-crypto-nodejs (package.json's "overrides"): the
// application-service tests (appservice.as.mjs) use no encryption, and the real package's
// install script downloads a native binary. The bot SDKs require it when they load, so
// requiring it works; calling or constructing anything from it throws "crypto unavailable".
"use strict";

function unavailable(name) {
    throw new Error(`crypto unavailable: ${name} (tests/e2e/crypto-unavailable is a stub)`);
}

function stub(name) {
    return new Proxy(function () {}, {
        get: (target, key) => (typeof key === "symbol" || key === "then" ? undefined
                                                                         : stub(`${name}.${key}`)),
        apply: () => unavailable(name),
        construct: () => unavailable(name),
    });
}

module.exports = new Proxy({}, {
    get: (target, key) => (typeof key === "symbol" || key === "then" || key === "__esModule"
                           ? undefined : stub(key)),
});
