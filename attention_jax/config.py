"""Two frozen dataclasses: every model the chapter trains, and how it is trained.

Every variant the chapter trains is a `ModelConfig`, made with `dataclasses.replace(BASE, ...)`;
no variant needs a class of its own. A training budget is a `TrainConfig`. Every
impossible combination is refused at construction with one `ConfigError` (a
`ValueError`) naming the field and the fix. Nothing here imports JAX, so a command line
can build and check its configs without paying for it.
"""
from __future__ import annotations

import dataclasses
import math
import numbers

from attention_jax.errors import ConfigError

MIXERS = ("none", "average", "head", "heads")
POSITIONS = ("none", "learned", "sinusoidal", "rope", "alibi")
NORMS = ("pre", "post")
INITS = ("torch", "gpt2")
# The compute dtype; parameters and optimizer state stay float32. float16 (a T4's tensor cores)
# trains with a dynamic loss scale (train.loss_scale); bfloat16 has float32's range and needs none.
DTYPES = ("float32", "bfloat16", "float16")
GELUS = ("exact", "tanh")
ACTIVATIONS = ("gelu", "relu")         # the feed-forward's nonlinearity; GELU's form is `gelu`


def _whole_numbers(config, names) -> None:
    """Integral values (a NumPy sweep's np.int64, say) stored as plain int, and every other real
    number (np.float32) of any field as a plain float, so configs compare, hash and serialise
    (JSON) alike; bools are left for the checks to refuse."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool) \
                and type(value) is not int:
            object.__setattr__(config, name, int(value))
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, numbers.Real) and not isinstance(value, (numbers.Integral, float)):
            object.__setattr__(config, field.name, float(value))


INT32_MAX = 2**31 - 1                    # steps, positions and counts live in int32 arrays
FLOAT32_TINY, FLOAT32_MAX = 1.1754943508222875e-38, 3.4028234663852886e38


def _whole(value) -> bool:
    """A positive whole number an int32 holds, not a bool (True is an int to Python, never a
    layer count)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= INT32_MAX


def _positive32(value) -> bool:
    """A positive number float32 holds as one: 1e-320 is 0 there, 1e39 is inf."""
    return _finite(value) and FLOAT32_TINY <= value <= FLOAT32_MAX


def _finite(value) -> bool:
    """A finite real number. nan compares False with everything, so `nan <= 0` would let it
    through a range check, and inf passes `> 0`; a bool is an int to Python but never a
    rate or an epsilon; a string from a config file would fail only deep inside training.
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 1024
    context: int = 128                 # the training window T
    max_positions: int | None = None   # rows of the learned position table (default: context)
    d_model: int = 128
    n_layers: int = 1
    # How a position sees its context: nothing, the uniform causal average, one head of
    # width d_model (no output projection, as the chapter's Head), or n_heads heads + W_o.
    mixer: str = "heads"
    n_heads: int = 4
    d_head: int | None = None          # default d_model // n_heads (d_model for mixer="head")
    residual: bool = True              # x + mixer(x), or replace x by mixer(x)
    positions: str = "learned"
    feed_forward: bool = True
    ff_mult: int = 4
    layer_norm: bool = True
    norm: str = "pre"                  # LayerNorm on each sub-layer's input, or after the add
    scale: bool = True                 # divide scores by √d_head
    dropout: float = 0.0               # attention weights, sub-layer outputs, embedding sum
    dtype: str = "float32"             # compute dtype: bfloat16 or float16 = mixed precision
    tie_embeddings: bool = False       # output layer reuses the token table
    bias: bool = True                  # biases in W_o, feed-forward, LayerNorm, output layer
    qkv_bias: bool = False             # the chapter's heads have none; GPT-2's do
    init: str = "torch"                # PyTorch's default initialisation (the book's), or GPT-2's
    ln_eps: float = 1e-5
    rope_base: float = 10000.0
    gelu: str = "exact"                # the feed-forward's GELU: "exact" (erf, the book's) or
                                       # "tanh" (GPT-2's)
    output_bias: bool = True           # an untied output layer's bias (with `bias`);
                                       # GPT-2's has none
    # Where compiled models (tracr's: attention_jax.compiled) differ; the defaults: all others.
    causal: bool = True                # attend to the past and oneself; False: to every position
    activation: str = "gelu"           # the feed-forward's nonlinearity: "gelu" or "relu"
    ff_width: int | None = None        # the feed-forward's inner width (default ff_mult · d_model)
    output_size: int | None = None     # the logits' width (default vocab_size): its own alphabet

    def __post_init__(self):
        def need(ok, msg):
            if not ok:
                raise ConfigError(f"invalid ModelConfig: {msg}")

        _whole_numbers(self, ("vocab_size", "context", "max_positions", "d_model", "n_layers",
                              "n_heads", "d_head", "ff_mult", "ff_width", "output_size"))
        # A switch must be a bool: the string "false" from a config file is truthy and would
        # leave LayerNorm on while saying it is off.
        for name in ("residual", "feed_forward", "layer_norm", "scale", "tie_embeddings", "bias",
                     "qkv_bias", "output_bias", "causal"):
            need(isinstance(getattr(self, name), bool),
                 f"{name}={getattr(self, name)!r} must be True or False")
        need(self.mixer in MIXERS, f"mixer={self.mixer!r}; choose one of {', '.join(MIXERS)}")
        need(self.positions in POSITIONS,
             f"positions={self.positions!r}; choose one of {', '.join(POSITIONS)}")
        need(self.norm in NORMS, f"norm={self.norm!r}; choose 'pre' or 'post'")
        need(self.init in INITS, f"init={self.init!r}; choose 'torch' or 'gpt2'")
        for name in ("vocab_size", "context", "d_model", "n_layers", "n_heads", "ff_mult"):
            need(_whole(getattr(self, name)),
                 f"{name}={getattr(self, name)!r} must be a positive integer up to 2**31 - 1")
        need(self.max_positions is None or _whole(self.max_positions),
             f"max_positions={self.max_positions!r} must be a positive integer up to 2**31 - 1 "
             "(or None for context)")
        need(_finite(self.dropout) and 0.0 <= self.dropout < 1.0,
             f"dropout={self.dropout!r} must be a number in [0, 1) (the probability of dropping)")
        # LayerNorm divides by sqrt(var + ln_eps): 0 divides a constant vector by zero and a
        # negative one takes the root of a negative number, both NaN at the first step.
        need(_positive32(self.ln_eps),
             f"ln_eps={self.ln_eps!r} must be a finite positive number (LayerNorm's variance "
             "floor, e.g. 1e-5)")
        # RoPE's frequencies are rope_base ** (-2i/d): 0 or a negative base gives inf or NaN.
        need(_positive32(self.rope_base) and self.rope_base > 1,
             f"rope_base={self.rope_base!r} must be a finite number above 1 (RoPE's frequency "
             "base, e.g. 10000; below 1 its frequencies overflow)")
        if self.mixer == "heads" and self.d_head is None:
            need(self.d_model % self.n_heads == 0,
                 f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                 "pick a multiple or set d_head")
        need(self.d_head is None or _whole(self.d_head),
             f"d_head={self.d_head!r} must be a positive integer up to 2**31 - 1")
        if self.positions == "rope":
            need(self.mixer in ("head", "heads"),
                 "positions='rope' rotates queries and keys; it needs mixer 'head' or 'heads'")
            need(self.d_head_used % 2 == 0,
                 f"positions='rope' needs an even d_head, got {self.d_head_used}")
        if self.positions == "alibi":
            need(self.mixer in ("head", "heads"),
                 "positions='alibi' biases attention scores; it needs mixer 'head' or 'heads'")
        if self.positions == "learned":
            need(self.max_positions_used >= self.context,
                 f"max_positions={self.max_positions} is smaller than context={self.context}")
        need(self.dtype in DTYPES, f"dtype={self.dtype!r}; choose one of {', '.join(DTYPES)}")
        need(self.gelu in GELUS,
             f"gelu={self.gelu!r}; choose 'exact' or 'tanh' (GPT-2's approximation)")
        need(not (self.mixer == "head" and self.d_head not in (None, self.d_model)),
             "mixer='head' has no output projection, so d_head must equal d_model")
        self._check_compiled_fields(need)

    def _check_compiled_fields(self, need) -> None:
        """causal, activation, ff_width and output_size: each a value the modules can build."""
        need(self.causal or self.mixer in ("head", "heads"),
             f"causal=False lifts attention's mask, and mixer={self.mixer!r} has none (the "
             "average is causal as defined); use mixer 'head' or 'heads'")
        need(self.activation in ACTIVATIONS,
             f"activation={self.activation!r}; choose one of {', '.join(ACTIVATIONS)}")
        need(self.activation == "gelu" or self.gelu == "exact",
             f"gelu={self.gelu!r} picks GELU's form, but activation={self.activation!r}; "
             "leave gelu at 'exact'")
        for name in ("ff_width", "output_size"):
            value = getattr(self, name)
            need(value is None or _whole(value),
                 f"{name}={value!r} must be a positive integer up to 2**31 - 1 (or None)")
        width = self.ff_width
        need(width is None or self.ff_mult == 4 or width == self.ff_mult * self.d_model,
             f"ff_width={width} and ff_mult={self.ff_mult} name two widths; set one of them")
        need(not self.tie_embeddings or self.output_size in (None, self.vocab_size),
             f"output_size={self.output_size} differs from vocab_size={self.vocab_size}, and a "
             "tied output layer is the token table; set tie_embeddings=False")

    # What the model built from this config uses, where a field asks for something (or None: derive
    # it): `n_heads` -> `heads_used`, `d_head` -> `d_head_used`, `max_positions` ->
    # `max_positions_used`. Derived once here, so callers never recompute them differently.
    @property
    def heads_used(self) -> int:
        """The mixer's heads: n_heads for mixer="heads", 1 for "head", 0 for an average or none."""
        return {"heads": self.n_heads, "head": 1}.get(self.mixer, 0)

    @property
    def d_head_used(self) -> int:
        """Each head's width: d_head, else d_model // n_heads (d_model for mixer="head")."""
        if self.mixer == "head":
            return self.d_model
        return self.d_head or self.d_model // self.n_heads

    @property
    def d_ff(self) -> int:
        """The feed-forward's inner width: ff_width, else ff_mult · d_model."""
        return self.ff_width or self.ff_mult * self.d_model

    @property
    def output_size_used(self) -> int:
        """The logits' width: output_size, else vocab_size."""
        return self.output_size or self.vocab_size

    @property
    def post_norm(self) -> bool:
        """Whether a LayerNorm follows each sub-layer's add, LN(x + f(x)): layer_norm on and norm
        "post" (without LayerNorm there is nothing after the add, whatever `norm` says)."""
        return self.layer_norm and self.norm == "post"

    @property
    def max_positions_used(self) -> int:
        """Rows of the learned position table: max_positions, else the context."""
        return self.max_positions or self.context

    def to_dict(self) -> dict:
        """Every field as plain values (JSON as it is); `ModelConfig(**d)` makes the
        config again."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 3000
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.01        # torch.optim.AdamW's default, as the book trained
    b1: float = 0.9
    b2: float = 0.999
    warmup_steps: int = 0             # linear from 0 to lr, then the schedule
    schedule: str = "constant"        # after warmup: "constant" (the book) or "cosine" decay
    min_lr_ratio: float = 0.1         # cosine reaches lr * min_lr_ratio at step `steps` (optax's
                                      # count from 0: one step past the last, which
                                      # uses a little more)
    grad_clip: float = 0.0            # global-norm clipping; 0 = off
    log_every: int = 50
    eval_every: int = 0               # 0 = evaluate at the end only
    checkpoint_every: int = 500
    train_eval_windows: int = 360     # fixed train sample for train perplexity (≈ the val split)
    eval_batch: int = 32

    def __post_init__(self):
        def need(ok, msg):
            if not ok:
                raise ConfigError(f"invalid TrainConfig: {msg}")

        # The float fields first, each a finite number: a nan or inf learning rate (or
        # decay, or clip) trains without complaint and turns every weight into NaN.
        need(_positive32(self.lr),
             f"lr={self.lr!r} must be a finite positive number that float32 holds (from "
             f"{FLOAT32_TINY:.3g} to {FLOAT32_MAX:.3g}; e.g. 1e-3)")
        for name in ("weight_decay", "grad_clip"):
            value = getattr(self, name)
            need(_finite(value) and value >= 0,
                 f"{name}={value!r} must be a finite number >= 0 (0 = off)")
        # Adam's moment decay rates: 1 never forgets (the bias correction divides by 0),
        # above 1 or below 0 the averages grow without bound or flip sign.
        for name, usual in (("b1", 0.9), ("b2", 0.999)):
            value = getattr(self, name)
            need(_finite(value) and 0 <= value < 1,
                 f"{name}={value!r} must be a number in [0, 1) (usually {usual})")
        counts = ("steps", "batch_size", "log_every", "checkpoint_every", "train_eval_windows",
                  "eval_batch")
        _whole_numbers(self, counts + ("warmup_steps", "eval_every"))
        for name in counts:
            need(_whole(getattr(self, name)),
                 f"{name}={getattr(self, name)!r} must be a positive integer up to 2**31 - 1")
        for name in ("warmup_steps", "eval_every"):
            value = getattr(self, name)
            need(value == 0 or _whole(value),
                 f"{name}={value!r} must be a whole number from 0 to 2**31 - 1")
        if self.schedule not in ("constant", "cosine"):
            raise ConfigError(f"invalid TrainConfig: schedule={self.schedule!r}; choose "
                              "'constant' or 'cosine'")
        if not (_finite(self.min_lr_ratio) and 0 <= self.min_lr_ratio <= 1):
            raise ConfigError(f"invalid TrainConfig: min_lr_ratio={self.min_lr_ratio} "
                              "must be in [0, 1]")
        if self.schedule == "cosine" and self.warmup_steps >= self.steps:
            raise ConfigError(f"invalid TrainConfig: warmup_steps={self.warmup_steps} leaves no "
                              f"step of the {self.steps} to decay over")



# GPT-2 small, as released: 124,439,808 parameters with the output tied to the token table.
GPT2_SMALL = ModelConfig(vocab_size=50257, context=1024, d_model=768, n_layers=12, n_heads=12,
                         mixer="heads", positions="learned", tie_embeddings=True, qkv_bias=True,
                         init="gpt2", gelu="tanh")
