"""The rows (head widths and their setups), the budgets, and the book's figures."""
from __future__ import annotations

import dataclasses

from attention_jax.config import TrainConfig
from experiments.configs import FROZEN, LADDER_BUDGETS, ONE_BLOCK  # noqa: F401  (FROZEN: the table's threshold)


PROBE_WINDOWS = 16      # held-out windows the score statistics are measured on
SMALL_GAIN = 2.0        # |gain| below this many perplexity points is "worth nothing" (d_head 32)
BIG_GAIN = 5.0          # the least gain the chapter's 18 / 17 points must at least show (d_head 256, 1024)
COLLAPSED = 0.9         # share of frozen rows that counts as collapse (book 99.9%)


@dataclasses.dataclass(frozen=True)
class WidthRow:
    name: str
    label: str
    config: object              # ModelConfig (scale is set per variant)
    budget: str                 # "long" (the ladder's budget) or "short" (the chapter's 1500 x 32)
    book_gain: float | None = None
    book_gain_text: str | None = None

    @property
    def d_head(self) -> int:
        return self.config.d_head_used


# The ladder's block with one head of width d_head projecting up from d_model 128 (W_o back
# down), and no LayerNorm: the chapter's "one head, no normalisation before the projections".
_UP = dataclasses.replace(ONE_BLOCK, mixer="heads", n_heads=1, layer_norm=False)
ROWS = (
    WidthRow("d32", "4 heads x 32 + W_o, pre-norm block", ONE_BLOCK, "long", None, "≈0"),
    WidthRow("d128", "1 head x 128 + W_o, pre-norm block", dataclasses.replace(ONE_BLOCK, n_heads=1), "long"),
    WidthRow("d256", "1 head 128 -> 256 + W_o, no LayerNorm", dataclasses.replace(_UP, d_head=256), "short",
             18.0, "18"),
    WidthRow("d1024", "1 head 128 -> 1024 + W_o, no LayerNorm", dataclasses.replace(_UP, d_head=1024), "short",
             17.0, "17"),
)
# The chapter's score figures (l.116) name no width; init std 21 is (2/3)·√1024 for PyTorch's
# init without LayerNorm (10.7 at 256), so they are printed beside d1024.
BOOK_SCORES = {("d1024", False): {"std": "21 → 5147", "entropy": "→ 0", "frozen": "99.9%"},
               ("d1024", True): {"std": "→ 3.44"}}

# The long rows' budget is ctx.settings (the preset's TrainConfig, with --steps/--lr/--batch-size/
# --schedule/--eval-every applied); the short rows' is SHORT[preset], with the same overrides.
PRESETS = {
    "paper": dataclasses.replace(LADDER_BUDGETS["paper"], eval_every=250),
    # The ladder's cpu budget cut to 1500 steps (the positions table's): the d_head 32 gain stays
    # within +0.1 … +0.95 at every evaluation from 250 to 2250 steps, and 2250 would put the table
    # past 30 min (docs/results/scale_ablation.md).
    "cpu": dataclasses.replace(LADDER_BUDGETS["cpu"], steps=1500),
    "smoke": LADDER_BUDGETS["smoke"],
}
SHORT = {
    # The chapter's own short budget (lr unstated there: the chapter's 1e-3). The cpu preset keeps
    # it: the d_head 1024 collapse crosses 90% only at ~750-1000 steps (docs/results/scale_ablation.md).
    "paper": TrainConfig(steps=1500, batch_size=32, lr=1e-3, checkpoint_every=250, eval_every=250),
    "cpu": TrainConfig(steps=1500, batch_size=32, lr=1e-3, checkpoint_every=250, eval_every=250,
                       train_eval_windows=120),
    "smoke": LADDER_BUDGETS["smoke"],
}
VARIANTS = ((True, "÷√d"), (False, "no ÷"))
STATS = ("score_std", "entropy", "frozen")
