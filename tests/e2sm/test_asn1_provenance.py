"""The ASN.1 modules are the published texts named in schemas/asn1/PROVENANCE.md, byte for byte: an edit
to a module (a hand-made "fix", a dropped type) shows up as a hash mismatch here, not as a silent
difference on the wire."""
from __future__ import annotations

import hashlib
import re

from e2sm import _asn1

ROW = re.compile(r"^\| `([\w.-]+\.asn)` \|.*\| `([0-9a-f]{64})` \|$", re.M)


def test_every_module_is_the_published_text_named_in_provenance():
    listed = dict(ROW.findall((_asn1.ASN1_DIR / "PROVENANCE.md").read_text()))
    on_disk = {p.name for p in _asn1.ASN1_DIR.glob("*.asn")}
    assert set(listed) == on_disk
    for name, digest in listed.items():
        assert hashlib.sha256((_asn1.ASN1_DIR / name).read_bytes()).hexdigest() == digest, name
    used = {f for files in _asn1.MODULE_FILES.values() for f in files}
    assert used == on_disk


def test_the_published_modules_have_the_types_the_subset_lacked():
    kpm = _asn1.spec("kpm-v3.00").types
    for name in ("MatchingCondItem-Choice", "LogicalOR", "BinRangeDefinition", "MatchingUEidPerGP"):
        assert name in kpm, name
    rc = _asn1.spec("rc-v1.03").types
    for name in ("E2SM-RC-ControlMessage-Format2", "E2SM-RC-ControlOutcome-Format3", "E2SM-RC-EventTrigger"):
        assert name in rc, name
