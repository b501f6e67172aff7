"""Where attention looks, as one self-contained HTML document: no network, no torch, no widgets.

    view = viewer.view(model, ids, labels)            # every block's weights on one text
    view                                              # inline in Jupyter, Colab and VS Code
    view.save("attention.html")                       # the same, as a file any browser opens

Two views of weights [layers, heads, T, T]: the head view (the text in two columns, a line
from each query to the keys it reads, weighted by attention; hover a token to see where it
looks, or what looks at it; one head or all averaged) and the pattern grid (a small heatmap
per block and head; click one to enlarge it, hover a cell to read its weight). Colours are
viridis, which reads in greyscale and for the common colour-blindnesses. The weights travel
inside the page as 16-bit fractions (the lower triangle alone when causal), so a few hundred
tokens stay a few megabytes at most; everything is drawn on canvases. `PatchingView` shows a
patching sweep (`attention_jax.analysis.patching`) the same way: a heatmap of blocks by
positions or heads, hover a cell for its value; `CircuitView` draws edge scores
(`attention_jax.analysis.discovery`) on the model's graph, a line an edge. Every string goes in
as escaped JSON, so no label or title can change the page: a token such as `</script>` or
`<!--` is shown as text. Each view refuses, in one line, the result another view shows and a
title that is no text.
"""
from __future__ import annotations

import base64
import html
import json
import pathlib
import uuid

import numpy as np

from attention_jax.errors import ConfigError

_SCRIPT = (pathlib.Path(__file__).with_name("viewer.js"))


# What each kind of result is, and the view that shows it: given to another view, it says so.
_KINDS = {"Sweep": "a patching sweep: show it with PatchingView",
          "EdgeScores": "edge scores: draw them with CircuitView",
          **{view: "a view already: show it as it is"
             for view in ("AttentionView", "PatchingView", "CircuitView")}}


def _numbers(value, view: str, shows: str, takes: str = "") -> np.ndarray:
    """`value` as float64, or one line: another kind of result than the one the view `takes` (and
    the view for it), or no numbers."""
    kind = type(value).__name__
    if kind in _KINDS and kind != takes:
        raise ConfigError(f"{view} shows {shows}; this is {_KINDS[kind]}")
    try:
        return np.asarray(value, np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"{view} shows {shows}; got a {kind}, which holds no such numbers") \
            from None


def _text(title, labels=None, name: str = "labels") -> tuple[str, list[str] | None]:
    """The title, and each of the `labels` as text; one line for a title that is no text, or labels
    that are no sequence."""
    if not isinstance(title, str):
        raise ConfigError(f"title={title!r}: give the view's title as text (a str)")
    if labels is None:
        return title, None
    if isinstance(labels, (str, bytes)) or not hasattr(labels, "__len__"):
        raise ConfigError(f"{name}={labels!r:.60}: give a list of {name}, one a position")
    return title, [str(t) for t in labels]


class _View:
    """What every view shares: its fragment (viewer.js's `function`, drawing `payload()` into an
    element of CSS class `kind`), shown inline wherever HTML is (`_repr_html_`), saved as a page."""
    kind: str
    function: str
    title: str

    def html(self) -> str:
        """A fragment that shows the view wherever HTML is shown (a notebook cell, a page)."""
        return _fragment(self.kind, self.function, self.title, self.payload())

    def _repr_html_(self) -> str:
        return self.html()

    def save(self, path) -> pathlib.Path:
        """The view as a standalone HTML file."""
        return _page(path, self.title, self.html())


class AttentionView(_View):
    """Attention weights [L, H, T, T] (or [H, T, T], or [T, T]) and the T tokens they are over."""
    kind, function = "ajv", "attentionViewer"

    def __init__(self, weights, tokens, *, title: str = "attention"):
        w = _numbers(weights, "AttentionView", "attention weights [layers, heads, T, T]")
        w = w.reshape((1,) * (4 - w.ndim) + w.shape) if w.ndim < 4 else w
        title, tokens = _text(title, tokens, "tokens")
        T = len(tokens or ())
        if w.ndim != 4 or w.shape[-1] != w.shape[-2] or w.shape[-1] != T:
            raise ConfigError(f"attention weights of shape {np.shape(weights)} do not fit {T} "
                              "tokens; give [layers, heads, T, T] (or [heads, T, T], [T, T]) and T "
                              "tokens")
        if not np.all(np.isfinite(w)) or w.min() < -1e-6 or w.max() > 1 + 1e-6:
            raise ConfigError("attention weights must be finite and between 0 and 1 (a softmax's)")
        self.weights, self.tokens, self.title = np.clip(w, 0, 1), tokens, title
        self.causal = bool(np.all(np.triu(self.weights, k=1) == 0))

    def payload(self) -> dict:
        """What the page reads: the shape, the tokens, the weights as base64 uint16 fractions."""
        L, H, T, _ = self.weights.shape
        q = np.round(self.weights * 65535).astype("<u2")
        rows, cols = np.tril_indices(T)
        flat = q[..., rows, cols] if self.causal else q.reshape(L, H, T * T)
        return {"layers": L, "heads": H, "T": T, "causal": self.causal, "tokens": self.tokens,
                "title": self.title,
                "data": base64.b64encode(np.ascontiguousarray(flat).tobytes()).decode("ascii")}


class PatchingView(_View):
    """A patching sweep (`attention_jax.analysis.patching.Sweep`, or any [layer, ·] / [layer, head,
    position] array with its axis names) as an interactive heatmap; `labels`: the positions'
    tokens."""
    kind, function = "ajp", "patchingViewer"

    def __init__(self, sweep, labels=None, *, title: str = "patching"):
        values = _numbers(sweep, "PatchingView", "a patching sweep [layer, ...]", takes="Sweep")
        title, labels = _text(title, labels)
        default = ("layer", "position") if values.ndim == 2 else ("layer", "head", "position")
        axes = tuple(getattr(sweep, "axes", default))
        if values.ndim not in (2, 3) or len(axes) != values.ndim or not np.all(np.isfinite(values)):
            raise ConfigError(f"a patching view shows finite [layer, x] or [layer, head, position] "
                              f"values; got shape {values.shape}")
        if labels is not None and ("position" not in axes
                                   or len(labels) != values.shape[axes.index("position")]):
            raise ConfigError(f"{len(labels)} labels for a sweep over {', '.join(axes)} "
                              f"{values.shape}; give one per position")
        self.values, self.axes, self.title, self.labels = values, axes, title, labels
        self.hook = getattr(sweep, "hook", "a hook point")
        self.method = getattr(sweep, "method", "activation")

    def payload(self) -> dict:
        return {"shape": list(self.values.shape), "axes": list(self.axes),
                "values": self.values.ravel().tolist(), "labels": self.labels, "title": self.title,
                "hook": self.hook, "method": self.method}


class CircuitView(_View):
    """Edge scores (`discovery.EdgeScores`) drawn on the model's graph: each edge of `edges` (names;
    default: `pruning.circuit(scores, k=20)`) a line from its sender to its receiver's input, as
    wide as its |effect| and coloured by its sign; hover an edge for its value."""
    kind, function = "ajc", "circuitViewer"

    def __init__(self, scores, edges=None, *, title: str = "circuit"):
        from attention_jax.analysis.pruning import circuit
        if not hasattr(scores, "graph") or not hasattr(scores, "effect"):
            _numbers(scores, "CircuitView", "edge scores")     # a sweep, a view: the view it is for
            raise ConfigError(f"CircuitView shows edge scores (`discovery`, `attribution`); got a "
                              f"{type(scores).__name__}")
        graph, effect = scores.graph, _numbers(scores.effect, "CircuitView", "one effect an edge")
        title, _ = _text(title)
        if effect.shape != (len(graph.edges),) or not np.all(np.isfinite(effect)):
            raise ConfigError(f"a circuit view shows one finite effect per edge of its graph "
                              f"({len(graph.edges)}); got shape {effect.shape}")
        names = graph.names()
        chosen = circuit(scores, k=min(20, len(names))) if edges is None else \
            [str(e) for e in edges]
        unknown = sorted(set(chosen) - set(names))
        if unknown:
            raise ConfigError(f"the graph has no edge {unknown[0]!r}; its edges read like "
                              f"{names[0]!r}")
        self.graph, self.effect, self.edges, self.title = graph, effect, chosen, title
        self.method = getattr(scores, "method", "exact")

    def payload(self) -> dict:
        from attention_jax.analysis.edges import receiver_node
        place = {n: i for i, n in enumerate(self.graph.names())}
        blocks = 1 + max((int(n.split(".")[0]) for n in self.graph.senders if n != "embed"),
                         default=-1)
        edges = []
        for name in self.edges:
            sender, receiver = name.split("->")
            node, role = receiver_node(receiver)
            edges.append({"name": name, "from": sender, "to": node, "role": role,
                          "effect": self.effect[place[name]]})
        heads = [n for n in self.graph.senders if ".h" in n]
        return {"title": self.title, "method": self.method, "total": len(place), "blocks": blocks,
                "heads": 1 + max((int(n.split(".h")[1]) for n in heads), default=0),
                "nodes": [*self.graph.senders, "logits"], "edges": edges}


def _embedded(payload: dict) -> str:
    """JSON that no text in it can end the script it sits in, or open a comment there: <, > and & as
    escapes, and the line separators JavaScript once refused in strings."""
    text = json.dumps(payload)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(raw, escaped)
    return text


def _fragment(kind: str, function: str, title: str, payload: dict) -> str:
    # Random, not a count: a notebook keeps the outputs of a kernel since restarted, whose count
    # began again.
    uid = f"{kind}-{uuid.uuid4().hex}"
    return (f'<div class="{kind}" id="{uid}" data-title="{html.escape(title)}"></div>'
            f'<script>(function(){{{_SCRIPT.read_text(encoding="utf-8")}\n'
            f'{function}(document.getElementById("{uid}"), {_embedded(payload)});}})();</script>')


def _page(path, title: str, body: str) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}'
                    f'</title></head><body style="margin:16px">{body}</body></html>\n',
                    encoding="utf-8")
    return path


def view(model, ids, labels=None, *, title: str = "attention") -> AttentionView:
    """Every attention block's weights on one text (`ids` [T]); `labels`: how each token reads
    (default: its id)."""
    import jax.numpy as jnp
    from attention_jax.analysis.inspect import attention_blocks, deterministic, run_with_cache
    from attention_jax.layers import check_ids
    _text(title, labels)                        # before the model runs
    paths = attention_blocks(model)
    if not paths:
        raise ConfigError("this model has no attention blocks to view (its mixers are averages or "
                          "none)")
    ids = np.asarray(ids)
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 1 or not ids.size:
        raise ConfigError(f"a view shows one text: give its ids as [T] (or [1, T]) with T >= 1, "
                          f"got shape {ids.shape}; view each text of a batch on its own")
    check_ids(ids, model.config.vocab_size)
    model = deterministic(model)
    names = [f"{p}.attention.weights" for p in paths]
    _, cache = run_with_cache(model, jnp.asarray(ids[None]), names)
    weights = np.stack([np.asarray(cache[name][0], np.float32) for name in names])
    labels = labels if labels is not None else [str(int(i)) for i in ids]
    return AttentionView(weights, labels, title=title)
