"""Transformers compiled from RASP programs by tracr, in our modules, with their true circuits.

    program = compiled.compile_rasp(lib.make_reverse(rasp.tokens), vocab={1, 2, 3}, max_seq_len=5)
    model, encode, decode = compiled.from_tracr(program)
    decode(model(encode([1, 2, 3])))     # [["compiler_bos", 3, 2, 1]]: tracr's apply(...).decoded
    compiled.true_edges(program)          # {"embed->0.h0.q", ..., "3.h0->logits"}: graph_of's names

tracr (Lindner et al. 2023) compiles a RASP program into weights: each operation is a head or an
MLP reading named directions of the residual stream ("tokens:a", "indices:2", "one") and writing
others, so which parts compute the answer is known, and circuit discovery can be judged on it
(ACDC, Conmy et al. 2023, uses `reverse` and `frac_prevs`). Its model is ours as a config
(`config_of`): learned positions (row 0, the BOS's, zero), no LayerNorm, no biases (tracr's are
zero), unmasked heads of width key_size, ReLU MLPs of their own width, an untied readout onto the
output's directions. tracr's layer i is attention then MLP, as our Block i; what a layer leaves
unused (an empty half, heads and MLP columns past its own) is zeros in both. tracr and haiku are
imported inside the functions only: the library runs without them.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from flax import nnx

from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError, DataError
from attention_jax.model import LanguageModel


class Compiled(NamedTuple):
    """tracr's assembled model (weights, encoders) and the craft model it was assembled from (the
    blocks, each with the directions it reads and writes), which tracr's own compiler drops."""
    assembled: Any
    craft: Any


def compile_rasp(program, vocab, max_seq_len: int, *, causal: bool = False,
                 mlp_exactness: int = 100) -> Compiled:
    """tracr's `compile_rasp_to_model`: its passes, in its order, keeping the craft model."""
    try:
        from tracr.compiler import (basis_inference, craft_graph_to_model, expr_to_craft_graph,
                                    rasp_to_graph, validating)
        from tracr.compiler.craft_model_to_transformer import craft_model_to_transformer
        from tracr.compiler.compiling import COMPILER_BOS, COMPILER_PAD
        from tracr.craft.bases import BasisDirection
        from tracr.rasp import rasp
    except ImportError:
        raise ConfigError("tracr is not installed: pip install tracr-pypi dm-haiku") from None
    unsupported = validating.static_validate(program)
    if unsupported:
        raise ConfigError("tracr cannot compile this program: " + "; ".join(
            f"{e.expr.name}: {e.reason}" for e in unsupported))
    if COMPILER_BOS in vocab or COMPILER_PAD in vocab:
        raise ConfigError(f"the vocabulary holds {COMPILER_BOS!r} or {COMPILER_PAD!r}, tracr's own "
                          "tokens; rename that value")
    extracted = rasp_to_graph.extract_rasp_graph(program)
    graph, sources, sink = extracted.graph, extracted.sources, extracted.sink
    basis_inference.infer_bases(graph, sink, vocab, max_seq_len)
    bos = BasisDirection(rasp.tokens.label, COMPILER_BOS)
    expr_to_craft_graph.add_craft_components_to_rasp_graph(graph, bos_dir=bos,
                                                           mlp_exactness=mlp_exactness)
    craft = craft_graph_to_model.craft_graph_to_model(graph, sources)
    assembled = craft_model_to_transformer(
        craft_model=craft, graph=graph, sink=sink, max_seq_len=max_seq_len, causal=causal,
        compiler_bos=COMPILER_BOS, compiler_pad=COMPILER_PAD)
    return Compiled(assembled, craft)


def readout(assembled) -> np.ndarray:
    """tracr's unembedding as a matrix [D, outputs]: its module (a projection onto the output's
    directions, kept in a closure, not in the parameters) applied to each residual direction."""
    import haiku as hk
    d = assembled.params["token_embed"]["embeddings"].shape[1]
    model = lambda x: assembled.get_compiled_model().unembed(x, use_unembed_argmax=False)
    out = hk.transform(model).apply({}, None, np.eye(d, dtype=np.float32))
    return np.asarray(out, np.float32).reshape(d, -1)


def config_of(assembled) -> ModelConfig:
    """The ModelConfig of tracr's assembled model; one built otherwise (LayerNorm, GELU) refused."""
    import jax
    cfg, params = assembled.model_config, assembled.params
    if cfg.layer_norm or cfg.activation_function is not jax.nn.relu or cfg.dropout_rate:
        raise ConfigError("this tracr model has LayerNorm, dropout or an MLP activation other than "
                          "ReLU, which tracr's compiler never builds; load one from compile_rasp")
    positions, d = params["pos_embed"]["embeddings"].shape
    return ModelConfig(vocab_size=params["token_embed"]["embeddings"].shape[0], context=positions,
                       d_model=d, n_layers=cfg.num_layers, mixer="heads", n_heads=cfg.num_heads,
                       d_head=cfg.key_size, positions="learned", ff_width=cfg.mlp_hidden_size,
                       activation="relu", layer_norm=False, bias=False, tie_embeddings=False,
                       causal=cfg.causal, output_size=readout(assembled).shape[1])


def _weights(assembled, config: ModelConfig) -> dict[str, np.ndarray]:
    """Our parameter path -> tracr's array; q, k and v side by side are our fused qkv's columns."""
    p = {name: {k: np.asarray(a, np.float32) for k, a in part.items()}
         for name, part in assembled.params.items()}
    biased = sorted(name for name, part in p.items() if np.any(part.get("b", 0)))
    if biased:
        raise ConfigError(f"this tracr model's {biased[0]} has a bias, which tracr's compiler "
                          "leaves zero; load one from compile_rasp")
    out = {"token_embed.embedding": p["token_embed"]["embeddings"],
           "position_embed.embedding": p["pos_embed"]["embeddings"],
           "lm_head.kernel": readout(assembled)}
    for i in range(config.n_layers):
        attn, mlp = f"transformer/layer_{i}/attn", f"transformer/layer_{i}/mlp"
        qkv = [p[f"{attn}/{c}"]["w"] for c in ("query", "key", "value")]   # [D, (head, width)]
        out |= {f"blocks.{i}.mixer.qkv.kernel": np.concatenate(qkv, axis=1),
                f"blocks.{i}.mixer.out.kernel": p[f"{attn}/linear"]["w"],
                f"blocks.{i}.ffn.up.kernel": p[f"{mlp}/linear_1"]["w"],
                f"blocks.{i}.ffn.down.kernel": p[f"{mlp}/linear_2"]["w"]}
    return out


def from_tracr(compiled) -> tuple[LanguageModel, Any, Any]:
    """(model, encode, decode) for tracr's assembled model (or a `Compiled`): our LanguageModel with
    its weights; `encode(values)` -> token ids [1, 1 + T], BOS first (a list of inputs of one
    length: [B, 1 + T]); `decode(logits)` -> each row's values as tracr decodes them."""
    assembled = getattr(compiled, "assembled", compiled)
    config = config_of(assembled)
    weights = _weights(assembled, config)
    model = nnx.eval_shape(lambda: LanguageModel(config, rngs=nnx.Rngs(0)))
    state = nnx.state(model, nnx.Param)
    for path, var in nnx.to_flat_state(state):
        var.set_value(jnp.asarray(weights[".".join(map(str, path))]))
    nnx.update(model, state)          # restored into the abstract model, as a checkpoint is
    return model, _encoder(assembled), _decoder(assembled)


def _encoder(assembled):
    table, bos = assembled.input_encoder.encoding_map, assembled.input_encoder.bos_token
    longest = len(assembled.params["pos_embed"]["embeddings"]) - 1

    def encode(values) -> jnp.ndarray:
        rows = [list(r) for r in values] if isinstance(values[0], (list, tuple)) else [values]
        bad = [v for r in rows for v in r if v not in table or v == bos]
        if bad or len({len(r) for r in rows}) != 1 or len(rows[0]) > longest:
            raise DataError(f"inputs of one length up to {longest}, each value one of "
                            f"{sorted(map(str, table))} but BOS; got {values!r}")
        return jnp.asarray([[table[bos]] + [table[v] for v in r] for r in rows], jnp.int32)
    return encode


def _decoder(assembled):
    out, bos = assembled.output_encoder, assembled.input_encoder.bos_token

    def decode(logits) -> list[list]:
        """Logits [B, 1 + T, outputs] -> per row [BOS, value, ...]: each position's argmax as the
        output's value (categorical), or its one logit (numerical)."""
        logits = np.asarray(logits)
        if hasattr(out, "encoding_map"):                  # categorical
            rows = [out.decode(r.tolist()) for r in logits.argmax(-1)]
        else:
            rows = logits[..., 0].tolist()
        return [[bos, *row[1:]] for row in rows]
    return decode


# --- the true circuit ----------------------------------------------------------------------------

def _placed(craft) -> list[tuple[int, bool, Any]]:
    """(layer, is MLP, block) for each craft block where tracr's assembler puts it: in the next half
    of its kind (2i: layer i's attention, 2i + 1: its MLP); a half skipped stays zero."""
    from tracr.craft.transformers import MLP
    placed, half = [], 0
    for block in craft.blocks:
        mlp = isinstance(block, MLP)
        half += (half % 2) != mlp
        placed.append((half // 2, mlp, block))
        half += 1
    return placed


def _used(space, matrix, axis: int, at: dict) -> set[int]:
    """The directions of `space` that a block's matrix weighs (a row, axis=1, or a column, axis=0,
    not all zero): one in the space but multiplied by zeros is neither read nor written."""
    live = np.abs(np.asarray(matrix)).sum(axis) > 0
    return {at[str(d)] for d, on in zip(space.basis, live) if on}


def reads_and_writes(compiled: Compiled) -> tuple[dict[str, set[int]], dict[str, set[int]]]:
    """Each receiver's and sender's residual directions (indices into `residual_labels`), under the
    names of `edges.graph_of`. The embedding writes what its tables hold (tokens, positions, "one");
    the logits read the output's directions."""
    assembled = compiled.assembled
    labels = assembled.residual_labels
    at = {label: i for i, label in enumerate(labels)}
    if len(at) != len(labels):
        raise ConfigError("two residual directions print alike (a value and its string?); "
                          "rename one")
    tables = [np.asarray(assembled.params[t]["embeddings"]) for t in ("token_embed", "pos_embed")]
    writes = {"embed": set(np.flatnonzero(sum(np.abs(t).sum(0) for t in tables)).tolist())}
    reads = {"logits": set(np.flatnonzero(np.abs(readout(assembled)).sum(1)).tolist())}
    for layer, mlp, block in _placed(compiled.craft):
        if mlp:
            reads[f"{layer}.ffn"] = _used(block.fst.input_space, block.fst.matrix, 1, at)
            writes[f"{layer}.ffn"] = _used(block.snd.output_space, block.snd.matrix, 0, at)
            continue
        for h, head in enumerate(block.as_multi().heads()):
            qk, ov, name = head.w_qk, head.w_ov, f"{layer}.h{h}"
            reads |= {f"{name}.q": _used(qk.left_space, qk.matrix, 1, at),
                      f"{name}.k": _used(qk.right_space, qk.matrix, 0, at),
                      f"{name}.v": _used(ov.input_space, ov.matrix, 1, at)}
            writes[name] = _used(ov.output_space, ov.matrix, 0, at)
    return reads, writes


def _step(name: str) -> float:
    """A sender's or receiver's place in the forward pass: embed, each layer's heads, its MLP."""
    if name in ("embed", "logits"):
        return -1 if name == "embed" else float("inf")
    layer, part = name.split(".")[:2]
    return 2 * int(layer) + (part == "ffn")


def true_edges(compiled: Compiled) -> set[str]:
    """The edges the program computes with, named as `edges.graph_of(model).names()`: sender ->
    receiver where the receiver reads (with a nonzero weight) a residual direction the sender
    writes, the sender first. Padding heads and empty halves read and write nothing."""
    reads, writes = reads_and_writes(compiled)
    return {f"{s}->{r}" for s, out in writes.items() for r, into in reads.items()
            if out & into and _step(s) < _step(r)}
