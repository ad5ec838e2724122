"""The public headers and the plugin author's guide stand on their own: every file, header
and decision record they cite exists in this repository, they cite nothing a plugin author
does not have (design notes outside the repository), and the metrics they name are the
ones the server exports, with the label names they give (include/atrium/*.h,
docs/plugins.md)."""

import glob
import os
import re
import unittest

from common import AtriumTestCase, testplug
from harness import REPO_ROOT

HEADERS = sorted(glob.glob(os.path.join(REPO_ROOT, "include", "atrium", "*.h")))
GUIDE = os.path.join(REPO_ROOT, "docs", "plugins.md")
# A path of this repository: starts a word (not inside build/core/... or /usr/lib/...).
REPO_PATH = re.compile(r"(?<![\w/.-])((?:docs|tests|plugins|core|examples|include|deploy)/"
                       r"[\w./{}<>*-]*[\w/])")
HEADER_REF = re.compile(r"\batrium/(\w+\.h)\b")
ADR_REF = re.compile(r"\bADR-(\d{4})\b")
# What a plugin author does not have: notes outside the repository, and promises of
# metric kinds the host table does not offer.
FORBIDDEN = [re.compile(p, re.I) for p in (r"DESIGN\.md", r"DESIGN §", r"§", r"spec digest",
                                           r"\.\./shared", r"/work/", r"histogram")]


def documents():
    return HEADERS + [GUIDE]


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


class ReferencesTest(unittest.TestCase):
    def test_every_cited_file_exists(self):
        for doc in documents():
            for ref in REPO_PATH.findall(read(doc)):
                if any(c in ref for c in "{}<>*"):
                    ref = ref[:min(ref.find(c) for c in "{}<>*" if c in ref)]
                    ref = ref[:ref.rfind("/") + 1] if "/" in ref else ref
                with self.subTest(doc=os.path.relpath(doc, REPO_ROOT), ref=ref):
                    self.assertTrue(os.path.exists(os.path.join(REPO_ROOT, ref)),
                                    f"{ref} does not exist")

    def test_every_cited_header_exists(self):
        for doc in documents():
            for name in HEADER_REF.findall(read(doc)):
                with self.subTest(doc=os.path.relpath(doc, REPO_ROOT), header=name):
                    self.assertTrue(os.path.exists(os.path.join(REPO_ROOT, "include", "atrium", name)))

    def test_every_cited_decision_record_exists(self):
        for doc in documents():
            for number in ADR_REF.findall(read(doc)):
                with self.subTest(doc=os.path.relpath(doc, REPO_ROOT), adr=number):
                    self.assertTrue(glob.glob(os.path.join(REPO_ROOT, "docs", "adr", f"{number}-*.md")))

    def test_nothing_outside_the_repository_is_cited(self):
        for doc in documents():
            text = read(doc)
            for pattern in FORBIDDEN:
                with self.subTest(doc=os.path.relpath(doc, REPO_ROOT), pattern=pattern.pattern):
                    self.assertIsNone(pattern.search(text))


class DocumentedMetricsTest(AtriumTestCase):
    FAMILY = re.compile(r'(atrium_[a-z]+_)\{([a-z_,]+)\}\{(\w+)="<plugin>\.<\w+>"\}')

    def test_the_metrics_host_h_names_are_exported_with_its_label_names(self):
        families = self.FAMILY.findall(read(os.path.join(REPO_ROOT, "include", "atrium", "host.h")))
        self.assertGreaterEqual(len(families), 4, "pool, budget, line and rate limit metrics")
        srv = self.start_server(plugins=testplug())
        samples = srv.metrics()
        for prefix, members, label in families:
            for member in members.split(","):
                name = prefix + member
                with self.subTest(metric=name, label=label):
                    labelled = [lbl for n, lbl, _ in samples if n == name]
                    self.assertTrue(labelled, f"{name} is not exported")
                    self.assertTrue(all(label in lbl for lbl in labelled),
                                    f"{name} is exported without the label {label}")
        # testplug's own pool, line and rate limiter carry "<plugin>.<name>".
        for name, label, value in (("atrium_pool_threads", "pool", "testplug.work"),
                                   ("atrium_line_slots", "line", "testplug.line"),
                                   ("atrium_ratelimit_keys", "action", "testplug.limited")):
            with self.subTest(metric=name):
                self.assertIsNotNone(srv.metric(name, {label: value}))


if __name__ == "__main__":
    unittest.main()
