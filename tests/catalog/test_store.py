"""Atomic commits, output checks and refs."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from catalog.datasets import Artifact, ArtifactRef, Table, TableRef
from catalog.store import Catalog
from common.errors import CatalogError


def test_commit_table_and_artifact(catalog: Catalog):
    w = catalog.writer("s-1", {"rows": Table(view="v"), "ckpt": Artifact()})
    (w.output_dir("ckpt") / "weights.bin").write_bytes(b"\x00" * 10)
    assert not catalog.has("s-1")
    manifest = w.commit({"rows": pa.table({"x": [1, 2]})}, {"perf/seconds": 0.5}, {"stage": "s", "version": 1})
    assert catalog.has("s-1") and manifest["outputs"]["rows"]["rows"] == 2
    rows = catalog.ref("s-1", "rows")
    assert isinstance(rows, TableRef) and rows.read()["x"].to_pylist() == [1, 2]
    ckpt = catalog.ref("s-1", "ckpt")
    assert isinstance(ckpt, ArtifactRef) and (ckpt.local_path() / "weights.bin").stat().st_size == 10
    assert catalog.result_keys() == ["s-1"]
    assert os.listdir(catalog.root.path("_staging")) == []


def test_missing_output_is_not_committed(catalog: Catalog):
    w = catalog.writer("s-2", {"rows": Table(), "ckpt": Artifact()})
    with pytest.raises(CatalogError, match="stage produced nothing for its declared output 'ckpt'"):
        w.commit({"rows": pa.table({"x": [1]})}, {}, {})
    w.abort()
    assert not catalog.has("s-2") and catalog.result_keys() == []


def test_table_folder_must_hold_only_parquet(catalog: Catalog):
    w = catalog.writer("s-3", {"rows": Table()})
    (w.output_dir("rows") / "notes.txt").write_text("x")
    with pytest.raises(CatalogError, match="files that are not Parquet"):
        w.commit({}, {}, {})


def test_table_returned_for_artifact_is_rejected(catalog: Catalog):
    w = catalog.writer("s-4", {"ckpt": Artifact()})
    with pytest.raises(CatalogError, match="output 'ckpt' is an artifact"):
        w.commit({"ckpt": pa.table({"x": [1]})}, {}, {})


def test_concurrent_commit_of_same_key_keeps_the_first(catalog: Catalog):
    a = catalog.writer("s-5", {"rows": Table()})
    b = catalog.writer("s-5", {"rows": Table()})
    a.commit({"rows": pa.table({"x": [1]})}, {}, {"who": "a"})
    b.commit({"rows": pa.table({"x": [1]})}, {}, {"who": "b"})
    assert catalog.manifest("s-5")["who"] == "a"
    assert os.listdir(catalog.root.path("_staging")) == []


def test_unknown_result_and_output(catalog: Catalog):
    with pytest.raises(CatalogError, match="no committed result 'nope'"):
        catalog.manifest("nope")
    w = catalog.writer("s-6", {"rows": Table()})
    w.commit({"rows": pa.table({"x": [1]})}, {}, {})
    with pytest.raises(CatalogError, match="has no output 'other'"):
        catalog.ref("s-6", "other")


def test_file_uri_root(tmp_path):
    catalog = Catalog(f"file://{tmp_path}/uri-root")
    assert catalog.root.is_local
    w = catalog.writer("s-7", {"rows": Table()})
    w.commit({"rows": pa.table({"x": [3]})}, {}, {})
    assert Catalog(str(tmp_path / "uri-root")).ref("s-7", "rows").read()["x"].to_pylist() == [3]


def test_a_selection_stores_row_numbers_and_reads_as_the_selected_rows(tmp_path):
    import pyarrow as pa

    from catalog.datasets import Selection, Table
    from catalog.store import Catalog

    catalog = Catalog(str(tmp_path / "cat"))
    source = pa.table({"a": list(range(10)), "b": [str(i) for i in range(10)]})
    w = catalog.writer("src-1", {"t": Table()})
    w.commit({"t": source}, {}, {})
    part = catalog.ref("src-1", "t", (1, 2))  # rows 5..9
    w = catalog.writer("sel-1", {"kept": Table()})
    w.commit({"kept": Selection(part, [4, 0, 2])}, {}, {})
    ref = catalog.ref("sel-1", "kept")
    assert ref.read().to_pylist() == [{"a": 9, "b": "9"}, {"a": 5, "b": "5"}, {"a": 7, "b": "7"}]
    assert ref.read(["b"]).column_names == ["b"]
    stored = pa.parquet.read_table(ref.paths()[0])
    assert stored.column_names == ["row"] and catalog.manifest("sel-1")["outputs"]["kept"]["selects"] == part.address


def test_a_selection_with_columns_of_its_own_reads_as_a_joined_table(tmp_path):
    import pyarrow as pa

    from catalog.datasets import Selection, Table
    from catalog.store import Catalog

    catalog = Catalog(str(tmp_path / "cat"))
    catalog.writer("src-1", {"t": Table()}).commit({"t": pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]})}, {}, {})
    catalog.writer("kept-1", {"k": Table()}).commit({"k": Selection(catalog.ref("src-1", "t"), [2, 0])}, {}, {})
    own = pa.table({"c": [[0.5], [1.5, 2.5]]})
    catalog.writer("adv-1", {"b": Table()}).commit({"b": Selection(catalog.ref("kept-1", "k"), [1, 0], own)}, {}, {})
    ref = catalog.ref("adv-1", "b")
    assert ref.read().to_pylist() == [{"a": 1, "b": "x", "c": [0.5]}, {"a": 3, "b": "z", "c": [1.5, 2.5]}]
    assert ref.read(["c", "a"]).to_pylist() == [{"c": [0.5], "a": 1}, {"c": [1.5, 2.5], "a": 3}]


def test_a_part_of_a_table_with_planned_groups_follows_group_edges_whatever_was_dropped(tmp_path):
    """Online-k: part j of a rollout is the j-th range of its planned groups. Group 1
    was dropped whole and one episode of group 2: by row count, part 0 would take
    group 4's first episode and part 1 the rest of it."""
    from catalog.datasets import GROUPS_KEY, Selection

    catalog = Catalog(str(tmp_path / "cat"))
    rows = [(g, s) for g in range(8) for s in range(2) if g != 1 and (g, s) != (2, 0)]
    table = pa.table({"group": [g for g, _ in rows], "sample": [s for _, s in rows]})
    catalog.writer("r-1", {"t": Table()}).commit({"t": table.replace_schema_metadata({GROUPS_KEY: b"8"})}, {}, {})
    catalog.writer("s-1", {"k": Table()}).commit({"k": Selection(catalog.ref("r-1", "t"), range(len(rows)))}, {}, {})
    for key, out in (("r-1", "t"), ("s-1", "k")):
        parts = [catalog.ref(key, out, (j, 2)) for j in range(2)]
        assert [sorted(set(p.read()["group"].to_pylist())) for p in parts] == [[0, 2, 3], [4, 5, 6, 7]]
        assert [p.read(["sample"]).num_rows for p in parts] == [5, 8]  # the group column read, not returned
        assert parts[0].read(["sample"]).column_names == ["sample"]
    plain = Catalog(str(tmp_path / "cat2"))  # without the planned groups: equal slices of the rows
    plain.writer("r-1", {"t": Table()}).commit({"t": table}, {}, {})
    assert plain.ref("r-1", "t", (0, 2)).read()["group"].to_pylist() == [0, 0, 2, 3, 3, 4]  # group 4 split
