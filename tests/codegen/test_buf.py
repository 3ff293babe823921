"""`buf generate` (buf.gen.yaml) runs the same generators as generate.py, with the same output.

Every file is byte-identical except the `*_pb2.py` modules, whose embedded descriptors carry the
`json_name`s buf fills in (see tools/codegen/generate.py); those are compared by descriptor.
"""

from __future__ import annotations

import generate
import pytest

BUF = generate.ROOT / generate.BUF
COMMITTED = generate.read_tree(generate.ROOT, generate.Layout())


@pytest.mark.skipif(not BUF.exists(), reason="buf is not installed (npm ci in tools/buf)")
def test_buf_generate_matches_the_committed_tree() -> None:
    tree = generate.generate_tree(generate.ROOT, driver="buf")
    assert generate.differences(tree, COMMITTED, semantic_pb2=True) == []
    byte_different = [p for p in tree if tree[p] != COMMITTED[p]]
    assert byte_different and all(p.endswith("_pb2.py") for p in byte_different)


def test_pb2_comparison_still_sees_descriptor_changes() -> None:
    path = next(p for p in COMMITTED if p.endswith("jobs_pb2.py"))
    edited = {**COMMITTED, path: COMMITTED[path].replace(b"lease_seconds", b"lease_secondz")}
    assert generate.differences(edited, COMMITTED, semantic_pb2=True) == [
        f"differs (embedded descriptor or code): {path}"
    ]


def test_buf_gen_yaml_passes_the_default_layout() -> None:
    """buf.gen.yaml spells out the plugin parameter generate.py passes."""
    text = (generate.ROOT / "buf.gen.yaml").read_text()
    for item in generate.parameter(generate.Layout()).split(","):
        assert f"- {item}\n" in text, item
