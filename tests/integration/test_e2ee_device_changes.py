"""Device-list changes beyond key uploads: a new device (a login), a renamed device and a
removed device (a logout) are each reported in keys/changes and /sync's
device_lists.changed, to room mates and to the user's own other devices, so clients
re-query the keys (end-to-end encryption breaks for a device others never learn of)."""

from test_e2ee_keys import E2eeServerCase, login, register, stream_token, sync


class DeviceChangesTest(E2eeServerCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ann = register(cls.srv, "dc_ann")
        cls.ben = register(cls.srv, "dc_ben")
        status, body = cls.ann.json("POST", "/_matrix/client/v3/createRoom", {"preset": "public_chat"})
        assert status == 200, body
        assert cls.ben.json("POST", f"/_matrix/client/v3/rooms/{body['room_id']}/join", {})[0] == 200

    def changed(self, acc, since):
        status, body = acc.json("GET", f"/_matrix/client/v3/keys/changes?from={since}"
                                       f"&to={stream_token(self.srv)}")
        self.assertEqual(status, 200, body)
        return body["changed"]

    def test_a_new_device_is_reported_to_room_mates_and_the_users_other_devices(self):
        token = sync(self.ben)["next_batch"]
        t0 = stream_token(self.srv)
        phone = login(self.srv, "dc_ann")
        self.assertIn(self.ann.user_id, self.changed(self.ben, t0))
        self.assertIn(self.ann.user_id, self.changed(self.ann, t0), "ann's first device learns too")
        self.assertIn(self.ann.user_id, sync(self.ben, since=token)["device_lists"]["changed"])
        # Renamed, then logged out: each is a change again.
        t1 = stream_token(self.srv)
        self.assertEqual(phone.json("PUT", f"/_matrix/client/v3/devices/{phone.device_id}",
                                    {"display_name": "Ann's phone"})[0], 200)
        self.assertEqual(self.changed(self.ben, t1), [self.ann.user_id])
        t2 = stream_token(self.srv)
        self.assertEqual(phone.json("POST", "/_matrix/client/v3/logout", {})[0], 200)
        self.assertEqual(self.changed(self.ben, t2), [self.ann.user_id])
        # A rename to the same name changes nothing.
        t3 = stream_token(self.srv)
        self.assertEqual(self.ann.json("PUT", f"/_matrix/client/v3/devices/{self.ann.device_id}",
                                       {})[0], 200)
        self.assertEqual(self.changed(self.ben, t3), [])
