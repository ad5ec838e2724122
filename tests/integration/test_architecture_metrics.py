"""docs/architecture.md against a running server: every pool its table "Pools in the tree
today" names is exported in /metrics as atrium_pool_*{pool="NAME"}, every pool /metrics
exports is in that table, and every metric family its paragraph "Limits show in
`/metrics`" names (atrium_pool_*, atrium_budget_*, ...) is exported, with the label it
gives. The server runs the media plugin (URL previews on, so its preview pool exists) and
the directory plugin, without a federation listener: the core's pools exist either way."""

import os
import re
import unittest

from harness import REPO_ROOT, Server

DOC = os.path.join(REPO_ROOT, "docs", "architecture.md")
DOC_NAME = "docs/architecture.md"
POOLS_PARAGRAPH = "**Pools in the tree today.**"
LIMITS_PARAGRAPH = "**Limits show in `/metrics`.**"
# A row of the pools table: its first cell is the pool's name in backquotes.
POOL_ROW = re.compile(r"^\|\s*`([A-Za-z0-9_.-]+)`\s*\|", re.M)
# A family in the limits paragraph: `atrium_pool_*{pool=...}` or `atrium_db_*`.
FAMILY = re.compile(r"`(atrium_[a-z0-9_]+_)\*(?:\{([a-z_]+)=\.\.\.\})?`")


def doc_part(text, marker):
    """The part of the document from marker to the next bold paragraph or heading."""
    start = text.find(marker)
    if start < 0:
        raise AssertionError(f"{DOC_NAME} has no paragraph starting {marker!r}")
    end = len(text)
    for following in ("\n\n**", "\n## "):
        at = text.find(following, start + len(marker))
        if at >= 0:
            end = min(end, at)
    return text[start:end]


def documented_pools(text):
    return POOL_ROW.findall(doc_part(text, POOLS_PARAGRAPH))


def documented_families(text):
    """[(prefix, label or None)] named in the limits paragraph."""
    return [(prefix, label or None) for prefix, label in
            FAMILY.findall(doc_part(text, LIMITS_PARAGRAPH))]


class ArchitectureMetricsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(DOC, encoding="utf-8") as f:
            cls.doc = f.read()
        cls.srv = Server(plugins={"media": {"enabled": True, "url_preview_enabled": True},
                                  "directory": {"enabled": True}})
        try:
            cls.srv.start()
            cls.samples = cls.srv.metrics()
        except BaseException:
            cls.srv._failed = True
            cls.srv.close(raise_errors=False)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.srv.close()

    def running_pools(self):
        return {labels["pool"] for name, labels, _ in self.samples
                if name.startswith("atrium_pool_") and "pool" in labels}

    def test_the_doc_parses_into_pools_and_families(self):
        pools = documented_pools(self.doc)
        self.assertGreaterEqual(len(pools), 4, f"pools parsed from {DOC_NAME}: {pools}")
        self.assertEqual(len(pools), len(set(pools)), f"a pool named twice in {DOC_NAME}: {pools}")
        families = [prefix for prefix, _ in documented_families(self.doc)]
        for prefix in ("atrium_pool_", "atrium_budget_", "atrium_line_", "atrium_ratelimit_",
                       "atrium_db_", "atrium_http_"):
            self.assertIn(prefix, families, f"{DOC_NAME}, {LIMITS_PARAGRAPH} no longer names "
                                            f"{prefix}*; parsed: {families}")

    def test_every_pool_the_doc_names_is_exported(self):
        running = self.running_pools()
        for metric in ("atrium_pool_threads", "atrium_pool_busy", "atrium_pool_queued",
                       "atrium_pool_queue_limit", "atrium_pool_refused_total"):
            have = {labels.get("pool") for name, labels, _ in self.samples if name == metric}
            self.assertEqual(have, running, f"{metric} is not exported for every pool")
        missing = sorted(set(documented_pools(self.doc)) - running)
        self.assertEqual(missing, [], f"{DOC_NAME} names pools that /metrics does not have "
                                      f"(as atrium_pool_*{{pool=...}}): {missing}; "
                                      f"pools in /metrics: {sorted(running)}")

    def test_every_exported_pool_is_named_in_the_doc(self):
        unnamed = sorted(self.running_pools() - set(documented_pools(self.doc)))
        self.assertEqual(unnamed, [], f"/metrics exports pools that {DOC_NAME} does not list "
                                      f"in its table {POOLS_PARAGRAPH}: {unnamed}")

    def test_every_metric_family_the_doc_names_is_exported_with_its_label(self):
        for prefix, label in documented_families(self.doc):
            with self.subTest(family=prefix + "*"):
                found = [(name, labels) for name, labels, _ in self.samples
                         if name.startswith(prefix)]
                self.assertTrue(found, f"{DOC_NAME} names {prefix}* but /metrics has no "
                                       f"metric starting {prefix}")
                if label:
                    unlabelled = sorted({name for name, labels in found if label not in labels})
                    self.assertEqual(unlabelled, [], f"{DOC_NAME} gives {prefix}* the label "
                                                     f"{label!r}; these lack it: {unlabelled}")


if __name__ == "__main__":
    unittest.main()
