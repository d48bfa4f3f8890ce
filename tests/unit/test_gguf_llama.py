"""The set-up's GGUF reader (scripts/gguf_llama.py) against the gguf package,
llama.cpp's own Python reference: a file written by its writer reads back with the
same metadata and the weights its dequantizers compute."""

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import gguf_llama

ROWS, COLS = 6, 64  # two 32-weight blocks per row
QUANT_TYPES = [
    gguf.GGMLQuantizationType.Q4_1,
    gguf.GGMLQuantizationType.Q8_0,
    gguf.GGMLQuantizationType.F16,
    gguf.GGMLQuantizationType.F32,
]


def write_file(path: Path, weights: np.ndarray) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.block_count", 2)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "<|im_end|>"])
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    for qtype in QUANT_TYPES:
        data = gguf.quants.quantize(weights, qtype)
        writer.add_tensor(f"blk.0.{qtype.name}.weight", data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    weights = np.random.default_rng(0).standard_normal((ROWS, COLS), np.float32)
    write_file(path, weights)
    return gguf_llama.read_gguf(path), gguf.GGUFReader(str(path))


def test_reader_reads_the_metadata(written):
    (metadata, _), _ = written
    assert metadata["llama.block_count"] == 2
    assert metadata["llama.rope.freq_base"] == 10000.0
    assert metadata["tokenizer.ggml.model"] == "gpt2"
    assert metadata["tokenizer.ggml.tokens"] == ["a", "b", "<|im_end|>"]
    assert metadata["tokenizer.ggml.add_bos_token"] is False


def test_dequantized_weights_equal_the_reference(written):
    (_, tensors), reference = written
    ours = {t.name: gguf_llama.dequantize(t) for t in tensors}
    assert len(ours) == len(QUANT_TYPES)
    for tensor in reference.tensors:
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        assert ours[tensor.name].shape == (ROWS, COLS)
        np.testing.assert_array_equal(ours[tensor.name], expected.reshape(ROWS, COLS))


def test_unpermute_rotary_inverts_llama_cpps_permutation():
    num_heads, head_dim = 3, 8
    weight = np.arange(num_heads * head_dim * 4, dtype=np.float32).reshape(-1, 4)
    # llama.cpp's convert_hf_to_gguf.py: interleave each head's rotary halves.
    permuted = (
        weight.reshape(num_heads, 2, head_dim // 2, 4).swapaxes(1, 2).reshape(-1, 4)
    )
    np.testing.assert_array_equal(
        gguf_llama.unpermute_rotary(permuted, num_heads), weight
    )


def test_hf_names():
    assert gguf_llama.hf_name("blk.3.attn_q.weight") == (
        "model.layers.3.self_attn.q_proj.weight"
    )
    assert gguf_llama.hf_name("token_embd.weight") == "model.embed_tokens.weight"
