"""The activation dump (pure; no torch): the safetensors reader and writer, the context check,
and the one function that turns a dump's (or a plugin's) arrays into a capture."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest

from gate.core.diagnosis.capture import ATTENTION, EMBEDDING, MLP, PREFILL, RESIDUAL, Capture, Point, Tensor
from gate.core.diagnosis.dump import (
    BF16,
    F32,
    check_context,
    context_sha256,
    module_shapes,
    named_capture,
    read_safetensors,
    write_safetensors,
)
from gate.core.diagnosis.locate import compare_path
from gate.errors import EngineError, InputError

N, W = 5, 8
POINTS = (
    Point(-1, EMBEDDING, "model.embed_tokens"),
    Point(0, ATTENTION, "model.layers.0.self_attn"),
    Point(0, MLP, "model.layers.0.mlp"),
    Point(0, RESIDUAL, "model.layers.0"),
    Point(1, ATTENTION, "model.layers.1.self_attn"),
    Point(1, MLP, "model.layers.1.mlp"),
    Point(1, RESIDUAL, "model.layers.1"),
)


def capture(values: dict[str, np.ndarray]) -> Capture:
    return Capture(
        PREFILL,
        N,
        tuple(Tensor(p, tuple(range(N)), values[p.module].astype(np.float32)) for p in POINTS if p.module in values),
    )


@pytest.fixture
def reference() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {p.module: rng.normal(size=(N, W)).astype(np.float32) for p in POINTS}


def honest_of(ref: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {k: v * (1 + rng.normal(scale=2e-3, size=v.shape)).astype(np.float32) for k, v in ref.items()}


def test_f32_round_trips_exactly_and_bf16_is_float32_rounded(reference: dict[str, np.ndarray]) -> None:
    arrays, meta = read_safetensors(write_safetensors(reference, {"context_sha256": "x"}), "d")
    assert meta == {"context_sha256": "x"}
    for k, v in reference.items():
        assert arrays[k].dtype == np.float32 and np.array_equal(arrays[k], v)
    arrays, _ = read_safetensors(write_safetensors(reference, {}, dtype=BF16), "d")
    for k, v in reference.items():
        assert np.array_equal(arrays[k].view(np.uint32) & 0xFFFF, np.zeros(v.shape, np.uint32))  # bf16 bits
        assert np.allclose(arrays[k], v, rtol=2.0**-8, atol=0) and not np.array_equal(arrays[k], v)
    exact = np.array([[1.0, -2.5, 0.15625, 2.0**100]], np.float32)  # bf16-representable values read back as is
    back, _ = read_safetensors(write_safetensors({"a": exact}, {}, dtype=BF16), "d")
    assert np.array_equal(back["a"], exact)


def test_safetensors_written_by_the_library_are_read(reference: dict[str, np.ndarray], tmp_path: object) -> None:
    numpy_api = pytest.importorskip("safetensors.numpy")
    data = numpy_api.save(reference, metadata={"context_sha256": "abc"})
    arrays, meta = read_safetensors(data, "d")
    assert meta["context_sha256"] == "abc" and all(np.array_equal(arrays[k], v) for k, v in reference.items())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not a safetensors file"),
        (b"\xff" * 8 + b"{}", "not a safetensors file"),
        ((7).to_bytes(8, "little") + b"not json", "not JSON"),
        ((2).to_bytes(8, "little") + b"[]", "not a JSON object"),
        (b"PK\x03\x04 a zip, say, or a pickle", "not a safetensors file"),
    ],
)
def test_a_file_that_is_not_safetensors_is_an_input_error(data: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message):
        read_safetensors(data, "dump.safetensors")


def _raw(header: dict[str, object], body: bytes) -> bytes:
    head = json.dumps(header).encode()
    return len(head).to_bytes(8, "little") + head + body


@pytest.mark.parametrize(
    ("entry", "body", "message"),
    [
        ({"dtype": "F16", "shape": [1, 2], "data_offsets": [0, 4]}, b"\0" * 4, "'model.layers.0.mlp' is F16"),
        ({"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}, b"\0" * 8, "'model.layers.0.mlp' is I64"),
        ({"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}, b"\0" * 12, "do not hold F32"),
        ({"dtype": "F32", "shape": [1, 2], "data_offsets": [0, 8]}, b"\0" * 4, "do not hold F32"),
        ({"dtype": "F32", "shape": "2x2", "data_offsets": [0, 8]}, b"\0" * 8, "not a list of sizes"),
    ],
)
def test_a_bad_tensor_entry_names_the_tensor(entry: dict[str, object], body: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message):
        read_safetensors(_raw({"model.layers.0.mlp": entry}, body), "d")


def test_the_context_is_checked_by_hash_or_by_ids() -> None:
    ids = [3, 1, 4, 1, 5]
    check_context({"context_sha256": context_sha256(ids)}, ids, "d")
    check_context({"token_ids": json.dumps(ids)}, ids, "d")
    with pytest.raises(InputError, match=r"context_sha256 .* is not the emitted context's"):
        check_context({"context_sha256": context_sha256(ids[:-1])}, ids, "d")
    with pytest.raises(InputError, match="token_ids are not the emitted context's"):
        check_context({"token_ids": json.dumps([*ids, 9])}, ids, "d")
    with pytest.raises(InputError, match="names no context"):
        check_context({"engine": "mine"}, ids, "d")
    assert context_sha256([1, 23]) != context_sha256([12, 3])


def test_missing_modules_are_left_out_and_a_leading_batch_is_accepted(reference: dict[str, np.ndarray]) -> None:
    ref = capture(reference)
    arrays = {k: v[None] for k, v in reference.items() if k != "model.layers.1.self_attn"}
    cand = named_capture(arrays, ref, "d")
    assert [t.point.module for t in cand.tensors] == [p.module for p in POINTS if p.module in arrays]
    finding = compare_path(ref, capture(honest_of(reference)), cand)
    assert finding.missing == ("model.layers.1.self_attn",) and finding.first is None


@pytest.mark.parametrize("error", [InputError, EngineError])
def test_a_wrong_shape_dtype_or_name_is_an_error_naming_the_tensor(
    reference: dict[str, np.ndarray], error: type[InputError] | type[EngineError]
) -> None:
    ref = capture(reference)
    bad_shape = {**reference, "model.layers.0.mlp": reference["model.layers.0.mlp"][:-1]}
    with pytest.raises(error, match=r"'model.layers.0.mlp' has shape \[4, 8\]: expected \[5, 8\]"):
        named_capture(bad_shape, ref, "d", error=error)
    bad_dtype = {**reference, "model.layers.1": reference["model.layers.1"].astype(np.float64)}
    with pytest.raises(error, match=r"'model\.layers\.1' is float64"):
        named_capture(bad_dtype, ref, "d", error=error)
    with pytest.raises(error, match=r"'layers\.0\.mlp' is not a module gate compares"):
        named_capture({"layers.0.mlp": reference["model.layers.0.mlp"]}, ref, "d", error=error)
    with pytest.raises(error, match="no tensor is named"):
        named_capture({}, ref, "d", error=error)
    with pytest.raises(error, match="expected a mapping"):
        named_capture([reference["model.layers.1"]], ref, "d", error=error)  # type: ignore[arg-type]


def test_a_planted_bug_is_located_and_removing_tensors_never_hides_it_silently(
    reference: dict[str, np.ndarray],
) -> None:
    ref, hon = capture(reference), capture(honest_of(reference))
    bug = dict(honest_of(reference))
    # Layer 0's MLP output 1.5x, carried into everything after it.
    for k in (
        "model.layers.0.mlp",
        "model.layers.0",
        "model.layers.1.self_attn",
        "model.layers.1.mlp",
        "model.layers.1",
    ):
        bug[k] = bug[k] * 1.5
    finding = compare_path(ref, hon, named_capture(bug, ref, "d"))
    assert finding.first is not None and finding.first.module == "model.layers.0.mlp"
    # Any subset of the tensors: the bug is still located at or after where it enters, or
    # every tensor that shows it is listed as not judged.
    shows = {k for k in bug if not np.array_equal(bug[k], honest_of(reference)[k])}
    names = list(bug)
    for mask in range(1, 1 << len(names)):
        kept = {k: bug[k] for i, k in enumerate(names) if mask >> i & 1}
        f = compare_path(ref, hon, named_capture(kept, ref, "d"))
        if shows & set(kept):
            assert f.first is not None and f.first.module in shows, kept.keys()
        else:
            assert f.first is None and shows <= set(f.missing)


def test_module_shapes_name_every_point_at_every_position(reference: dict[str, np.ndarray]) -> None:
    shapes = module_shapes(capture(reference))
    assert [(s.name, s.positions, s.width) for s in shapes] == [(p.module, N, W) for p in POINTS]
    assert shapes[0].to_dict() == {"name": "model.embed_tokens", "layer": -1, "part": "embedding", "shape": [N, W]}
    assert F32 == "F32"


F32_8 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize(
    ("head", "body", "message"),
    [
        # 2^62 x 4 floats: a byte count that wraps to 0 in 64 bits must not match offsets [0, 0].
        (b'{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}', b"", "do not hold F32"),
        (b'{"a":{"dtype":"BF16","shape":[9223372036854775807,9223372036854775807],"data_offsets":[0,0]}}', b"", "hold"),
        (b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"", "nests deeper"),
        # (the library keeps the last of the two, then finds the first's bytes a gap)
        (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}',
         b"\0" * 16, "names 'a' twice"),
        (b'{"__metadata__":{"x":"1"},"__metadata__":{"x":"2"}}', b"", "names '__metadata__' twice"),
        (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
         b"\0" * 8, "overlap"),
        (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}',
         b"\0" * 8, "overlap"),
        (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', b"\0" * 8, "gap"),
        (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 8, "4 bytes after the last tensor"),
    ],
)  # fmt: skip
def test_a_header_the_safetensors_library_refuses_is_refused_naming_why(head: bytes, body: bytes, message: str) -> None:
    """What the safetensors library refuses (its validation: byte counts without overflow,
    tensors laid end to end over the whole body, one entry per name) is an input error here,
    never an exit 4 (RecursionError, ValueError from a reshape) nor silently accepted."""
    data = len(head).to_bytes(8, "little") + head + body
    with pytest.raises(InputError, match=message):
        read_safetensors(data, "d")
    library = pytest.importorskip("safetensors.numpy")
    if b"[[[" not in head:  # (the library's own JSON reader refuses the deep one too; it is slow to build here)
        with pytest.raises(Exception):  # noqa: B017 (the library's own error types)
            library.load(data)


def test_a_dump_file_is_checked_from_its_header_before_its_body_is_read(tmp_path: object) -> None:
    """A 1 GiB file (sparse: it costs no disk) whose header is wrong is refused from its first
    bytes; the body is never read into memory."""
    import tracemalloc
    from pathlib import Path

    from gate.workflows.diagnose.activations import load_dump

    path = Path(str(tmp_path)) / "big.safetensors"
    head = json.dumps({"a": F32_8}).encode()  # the header says 8 bytes of body; the file holds 1 GiB
    with path.open("wb") as fh:
        fh.write(len(head).to_bytes(8, "little") + head)
        fh.truncate(1 << 30)
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match="bytes after the last tensor"):
            load_dump(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


def _read_or_refused(data: bytes, tmp_path: object, n: int) -> None:
    """`read_safetensors` and `load_dump` (the file reader gate diagnose uses) on `data`: a
    dump or an InputError, nothing else."""
    from pathlib import Path

    from gate.workflows.diagnose.activations import load_dump

    f = Path(str(tmp_path)) / f"d{n % 2}.safetensors"
    f.write_bytes(data)
    for read in (lambda: read_safetensors(data, "d"), lambda: load_dump(f)):
        with contextlib.suppress(InputError):
            read()


def test_a_dump_cut_short_or_with_any_byte_flipped_is_read_or_refused_never_an_error(
    reference: dict[str, np.ndarray], tmp_path: object
) -> None:
    """Damage as a disk, a copy cut short or a hostile writer leaves it: every length, and each
    byte flipped two ways, in both dtypes' files."""
    for dtype in (F32, BF16):
        whole = write_safetensors(
            {k: v for k, v in list(reference.items())[:3]}, {"context_sha256": "abc", "path": "decode"}, dtype=dtype
        )
        for n in range(len(whole)):
            _read_or_refused(whole[:n], tmp_path, n)
        for i in range(len(whole)):
            for flip in (0x01, 0x80):
                _read_or_refused(whole[:i] + bytes([whole[i] ^ flip]) + whole[i + 1 :], tmp_path, i)
