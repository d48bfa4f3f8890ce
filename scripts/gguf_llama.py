"""Read a Llama GGUF file into a Hugging Face checkpoint's parts, without transformers.

Only what SmolLM2's GGUF holds: metadata, F32/F16/Q8_0/Q4_1 tensors, a GPT-2 style
BPE vocabulary. The header is parsed with ``struct`` and the blocks dequantized
with whole-tensor numpy operations (the ``gguf`` package's reader and
transformers' loader spent most of a minute per conversion on Python loops).
Formats: github.com/ggml-org/ggml/blob/master/docs/gguf.md and ggml's block layouts.
"""

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF metadata value types -> struct format (8: string, 9: array, read apart).
SCALAR_FORMATS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i",
    6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
STRING, ARRAY = 8, 9
# ggml tensor types this reader dequantizes: name, weights per block, bytes per block.
F32, F16, Q4_1, Q8_0 = 0, 1, 3, 8
BLOCK_LAYOUTS = {F32: (1, 4), F16: (1, 2), Q4_1: (32, 20), Q8_0: (32, 34)}


@dataclass(frozen=True)
class GgufTensor:
    name: str
    shape: tuple[int, ...]  # torch order: the slowest dimension first
    ggml_type: int
    data: np.ndarray  # uint8, the tensor's bytes (a view of the file)


class _Cursor:
    """Reads GGUF's little-endian values from a buffer, front to back."""

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer
        self.offset = 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buffer, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.scalar("<Q")
        start, self.offset = self.offset, self.offset + length
        return bytes(self.buffer[start : self.offset]).decode("utf-8")

    def value(self, value_type: int) -> Any:
        if value_type == STRING:
            return self.string()
        if value_type == ARRAY:
            item_type, count = self.scalar("<I"), self.scalar("<Q")
            return [self.value(item_type) for _ in range(count)]
        return self.scalar(SCALAR_FORMATS[value_type])


def read_gguf(path: Path) -> tuple[dict[str, Any], list[GgufTensor]]:
    """The file's metadata and its tensors (views of the memory-mapped file)."""
    with path.open("rb") as file:
        buffer = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    cursor = _Cursor(buffer)
    if bytes(buffer[:4]) != MAGIC:
        raise ValueError(f"{path} is not a GGUF file")
    cursor.offset = 4
    version, num_tensors, num_fields = (cursor.scalar(f) for f in ("<I", "<Q", "<Q"))
    if version != 3:
        raise ValueError(f"{path}: GGUF version {version}, this reader reads 3")
    metadata = {}
    for _ in range(num_fields):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.scalar("<I"))
    infos = []
    for _ in range(num_tensors):
        name = cursor.string()
        dims = [cursor.scalar("<Q") for _ in range(cursor.scalar("<I"))]
        infos.append(
            (name, tuple(reversed(dims)), cursor.scalar("<I"), cursor.scalar("<Q"))
        )
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    start = -(-cursor.offset // alignment) * alignment
    whole = np.frombuffer(buffer, dtype=np.uint8)
    return metadata, [
        GgufTensor(
            name, shape, ggml_type, whole[start + offset :][: _nbytes(shape, ggml_type)]
        )
        for name, shape, ggml_type, offset in infos
    ]


def _nbytes(shape: tuple[int, ...], ggml_type: int) -> int:
    if ggml_type not in BLOCK_LAYOUTS:
        raise ValueError(
            f"ggml tensor type {ggml_type} is not one this reader dequantizes"
        )
    block_weights, block_bytes = BLOCK_LAYOUTS[ggml_type]
    return int(np.prod(shape)) // block_weights * block_bytes


def dequantize(tensor: GgufTensor) -> np.ndarray:
    """float32 weights of ``tensor.shape``, computed as ggml computes them."""
    data = tensor.data
    if tensor.ggml_type in (F32, F16):
        values = data.view(np.float32 if tensor.ggml_type == F32 else np.float16)
        return values.astype(np.float32).reshape(tensor.shape)
    blocks = data.reshape(-1, BLOCK_LAYOUTS[tensor.ggml_type][1])
    scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    if tensor.ggml_type == Q8_0:  # d, then 32 int8 quants
        weights = blocks[:, 2:].copy().view(np.int8).astype(np.float32) * scale
    else:  # Q4_1: d, m, then 16 bytes: weights 0-15 in low nibbles, 16-31 in high
        minimum = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        packed = blocks[:, 4:]
        nibbles = np.concatenate([packed & 0x0F, packed >> 4], axis=1)
        weights = scale * nibbles.astype(np.float32) + minimum
    return weights.reshape(tensor.shape)


def unpermute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of q/k projection rows (it interleaves each
    head's two rotary halves for its own rope kernel)."""
    rows = weight.shape[0]
    halves = weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
    return halves.swapaxes(1, 2).reshape(weight.shape)


# GGUF tensor names of a Llama block -> Hugging Face's, after "model.layers.N.".
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def hf_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    stem, suffix = gguf_name.rsplit(".", 1)
    if stem.startswith("blk."):
        _, layer, part = stem.split(".", 2)
        return f"model.layers.{layer}.{LAYER_NAMES[part]}.{suffix}"
    return f"{TOP_NAMES[stem]}.{suffix}"
