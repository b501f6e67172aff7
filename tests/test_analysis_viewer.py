"""The attention viewer: one self-contained page (no network), its numbers the model's, driven in a real
headless Chromium (Debian's, not a downloaded one): hover, choose, click, read, at a few hundred tokens."""
import base64
import pathlib
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attention_jax.analysis import viewer
from attention_jax.config import ModelConfig
from attention_jax.errors import ConfigError
from attention_jax.analysis.inspect import run_with_cache
from attention_jax.model import LanguageModel

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def tiny(T=12, layers=2, heads=4, **change):
    model = LanguageModel(ModelConfig(vocab_size=64, context=T, d_model=32, n_layers=layers, n_heads=heads, **change),
                          rngs=nnx.Rngs(0))
    ids = np.random.default_rng(0).integers(0, 64, T)
    return model, ids


def weights_of(model, ids) -> np.ndarray:
    _, cache = run_with_cache(model, jnp.asarray(ids[None]), "blocks.*.mixer.attention.weights")
    return np.stack([np.asarray(cache[f"blocks.{i}.mixer.attention.weights"][0]) for i in range(len(model.blocks))])


def test_the_page_carries_the_models_weights_and_needs_nothing_from_outside():
    model, ids = tiny()
    v = viewer.view(model, ids, [f"t{i}" for i in range(len(ids))])
    want = weights_of(model, ids)
    assert v.weights.shape == want.shape and v.causal
    np.testing.assert_allclose(v.weights, want, atol=1e-6)
    p = v.payload()
    q = np.frombuffer(base64.b64decode(p["data"]), "<u2").reshape(2, 4, -1) / 65535
    np.testing.assert_allclose(q, want[..., np.tril_indices(12)[0], np.tril_indices(12)[1]], atol=1 / 65535)
    page = v.html()
    assert v._repr_html_().count("attentionViewer(") == 2                # the script's definition and its call
    page = page.replace('"http://www.w3.org/2000/svg"', "")     # SVG's namespace: a name, never fetched
    for outside in ("http://", "https://", "<script src", "<link", "import(", "fetch("):
        assert outside not in page, outside


def test_what_is_no_attention_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="do not fit 3 tokens"):
        viewer.AttentionView(np.ones((2, 4, 4)) / 4, ["a", "b", "c"])
    with pytest.raises(ConfigError, match="between 0 and 1"):
        viewer.AttentionView(np.full((3, 3), 2.0), ["a", "b", "c"])
    with pytest.raises(ConfigError, match="no attention blocks"):
        viewer.view(LanguageModel(ModelConfig(vocab_size=8, context=4, mixer="average"), rngs=nnx.Rngs(0)), [1, 2, 3])


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("no chromium here (.ci/run installs Debian's)")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def open_page(browser, path: pathlib.Path, kind: str = "ajv"):
    """The page open once its view of `kind` (ajv attention, ajp patching, ajc circuit) has drawn: (page,
    the addresses it asked for, its errors)."""
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    asked, errors = [], []
    page.on("request", lambda r: asked.append(r.url))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector(f".{kind}[data-ready='1']", timeout=10_000)
    return page, asked, errors


@pytest.mark.slow
def test_in_a_real_browser_hover_choose_click_and_read(browser, tmp_path):
    model, ids = tiny()
    labels = [f"w{i}" for i in range(len(ids))]
    path = viewer.view(model, ids, labels, title="tiny").save(tmp_path / "attention.html")
    want = weights_of(model, ids)
    page, asked, errors = open_page(browser, path)
    lines = page.locator(".ajv-lines")
    assert "Left: each token as a query" in page.text_content(".ajv-help")   # the page says what is where
    page.hover(".ajv-queries .ajv-token[data-i='7']")                     # where query 7 looks, heads averaged
    assert int(lines.get_attribute("data-strongest")) == int(want[0, :, 7].mean(0).argmax())
    assert int(lines.get_attribute("data-lines")) == int((want[0, :, 7].mean(0) >= 0.01).sum())
    page.select_option(".ajv-layer", "1")
    page.select_option(".ajv-head", "2")                                  # one head of block 1
    page.hover(".ajv-queries .ajv-token[data-i='9']")
    assert int(lines.get_attribute("data-strongest")) == int(want[1, 2, 9].argmax())
    page.hover(".ajv-keys .ajv-token[data-i='3']")                        # what looks at key 3
    assert int(lines.get_attribute("data-strongest")) == int(want[1, 2, :, 3].argmax())
    page.click(".ajv-tab[data-view='grid']")
    assert page.locator(".ajv-cell").count() == 2 * 4 and "row = query, column = key" in page.text_content(".ajv-help")
    page.click(".ajv-cell[data-l='1'][data-h='3']")
    assert page.get_attribute(".ajv", "data-shown") == "1,3"
    box = page.locator(".ajv-big-canvas").bounding_box()
    i, j = 10, 4                                                          # hover the middle of cell (10, 4)
    page.mouse.move(box["x"] + (j + 0.5) * box["width"] / 12, box["y"] + (i + 0.5) * box["height"] / 12)
    assert page.text_content(".ajv-tip") == f"query {i} 'w{i}' -> key {j} 'w{j}': {want[1, 3, i, j]:.4f}"
    assert [u for u in asked if not u.startswith("file:")] == [] and errors == []
    page.close()


@pytest.mark.slow
def test_a_few_hundred_tokens_stay_usable(browser, tmp_path):
    T = 300
    weights = np.tril(np.random.default_rng(1).random((2, 4, T, T)))
    weights /= weights.sum(-1, keepdims=True)
    path = viewer.AttentionView(weights, [f"tok{i}" for i in range(T)]).save(tmp_path / "long.html")
    assert path.stat().st_size < 2_000_000
    page, asked, errors = open_page(browser, path)
    took = page.evaluate("""() => { const t = performance.now();
        document.querySelector(".ajv-queries .ajv-token[data-i='299']").dispatchEvent(new Event("mouseenter"));
        return performance.now() - t; }""")
    assert took < 500 and int(page.get_attribute(".ajv-lines", "data-strongest")) == int(weights[0, :, 299].mean(0).argmax())
    page.click(".ajv-tab[data-view='grid']")
    page.click(".ajv-cell[data-l='1'][data-h='0']")
    assert page.get_attribute(".ajv", "data-shown") == "1,0" and errors == [] and \
        [u for u in asked if not u.startswith("file:")] == []
    page.close()


HOSTILE = ["<!--", "<script>", "</script><script>window.pwned=1</script>", "<img src=x onerror=window.pwned=2>",
           "-->", "a\u2028b\u2029c", "nul\x00", "\"quoted'", "back\\slash", "&amp;", "plain"]


@pytest.mark.slow
def test_hostile_labels_and_titles_run_no_code_add_no_element_and_read_as_text(browser, tmp_path):
    """Labels are user text: the page shows any of them as text (a tokenizer's `<!--` followed by
    `<script>` once left a page blank), and runs none of it, in either view."""
    title = "</title><script>window.pwned=3</script>"
    pages = {}
    for n, labels in enumerate((["<!--", "<script>", "x"], HOSTILE)):     # the first: the report's own three
        T = len(labels)
        weights = np.tril(np.ones((1, 2, T, T)))
        weights /= weights.sum(-1, keepdims=True)
        pages[f"attention {n}"] = viewer.AttentionView(weights, labels, title=title).save(tmp_path / f"a{n}.html")
        pages[f"patching {n}"] = viewer.PatchingView(np.arange(2.0 * T).reshape(2, T), labels,
                                                     title=title).save(tmp_path / f"p{n}.html")
    for kind, path in pages.items():
        page = browser.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(path.as_uri())
        page.wait_for_selector("[data-ready='1']", timeout=10_000)
        assert page.evaluate("() => window.pwned") is None, kind
        assert page.evaluate("() => document.querySelectorAll('script').length") == 1, kind    # ours alone
        assert page.evaluate("() => document.querySelectorAll('img').length") == 0, kind
        assert page.title() == title and errors == [], kind
        shown = page.inner_text("body")
        for label in ("<!--", "<script>", "</script><script>window.pwned=1</script>", "-->", "&amp;"):
            assert label in shown or kind.endswith("0") and label not in ("<!--", "<script>"), (kind, label)
        page.close()


@pytest.mark.slow
def test_the_patching_view_draws_a_sweep_and_reads_it_back_on_hover(browser, tmp_path):
    from attention_jax.analysis.patching import activation_patch, normalized_logit_diff
    model = LanguageModel(ModelConfig(vocab_size=64, context=8, d_model=32, n_layers=2, n_heads=4), rngs=nnx.Rngs(0))
    clean = np.random.default_rng(0).integers(0, 64, (2, 8))
    corrupted = clean.copy()
    corrupted[:, 2] = (clean[:, 2] + 5) % 64
    metric = normalized_logit_diff(model, clean, corrupted, 3, 4)
    by_position = activation_patch(model, clean, corrupted, metric, hook="resid_pre", by="position", into="corrupted")
    labels = [f"t{int(i)}" for i in clean[0]]
    page, asked, errors = open_page(browser, viewer.PatchingView(by_position, labels, title="resid").save(tmp_path / "r.html"),
                                    "ajp")
    assert page.get_attribute(".ajp", "data-cells") == str(2 * 8)
    page.hover(".ajp-cell[data-r='1'][data-c='5']")
    assert page.text_content(".ajp-tip") == f"block 1, {labels[5]}: {by_position.values[1, 5]:.4f}"
    page.close()
    three = activation_patch(model, clean, corrupted, metric, hook="z", by="head_position", into="corrupted")
    page, asked, errors = open_page(browser, viewer.PatchingView(three, labels).save(tmp_path / "z.html"), "ajp")
    assert page.get_attribute(".ajp", "data-cells") == str(4 * 8)             # one block: heads x positions
    page.select_option(".ajp-layer", "1")
    h, p = np.unravel_index(int(np.argmax(np.abs(three.values[1]))), three.values[1].shape)   # a cell that is not 0
    page.hover(f".ajp-cell[data-r='{h}'][data-c='{p}']")
    assert page.text_content(".ajp-tip") == f"block 1, head {h}, {labels[p]}: {three.values[1, h, p]:.4f}"
    assert errors == [] and [u for u in asked if not u.startswith("file:")] == []
    page.close()


def test_a_patching_view_of_what_is_no_sweep_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="finite"):
        viewer.PatchingView(np.zeros(5))
    with pytest.raises(ConfigError, match="one per position"):
        viewer.PatchingView(np.zeros((2, 4)), ["a", "b"])


def test_a_view_is_of_one_text_of_token_ids():
    """A [2, 4] batch was read as one text of 8 tokens: a wrong picture. Refused, as are no ids and floats."""
    from attention_jax.errors import DataError
    model, ids = tiny()
    assert viewer.view(model, ids[None]).weights.shape[-1] == len(ids)          # [1, T] is one text
    for bad in (ids[:8].reshape(2, 4), [], [[]]):
        with pytest.raises(ConfigError, match="a view shows one text: give its ids as \\[T\\]") as info:
            viewer.view(model, bad)
        assert "\n" not in str(info.value)
    with pytest.raises(DataError, match="token ids must be integers, got float64"):
        viewer.view(model, ids.astype(float))


def test_every_view_has_an_id_of_its_own():
    """A notebook keeps the outputs of a kernel since restarted: ids that count from 0 again collide there."""
    import re
    model, ids = tiny()
    pages = [viewer.view(model, ids).html() for _ in range(3)] + [viewer.PatchingView(np.zeros((2, 3))).html()]
    found = [re.search(r'id="([^"]+)"', p).group(1) for p in pages]
    assert len(set(found)) == 4 and all(len(i) > 20 for i in found)


@pytest.mark.slow
def test_two_views_in_one_page_both_draw_and_a_large_sweep_draws(browser, tmp_path):
    """Two views of one page each draw (they shared an element id, and the second drew nothing); a
    12 x 12 x 1,024 patching view draws (its values spread into Math.max's arguments overflowed the stack)."""
    model, ids = tiny()
    body = viewer.view(model, ids).html() + viewer.view(model, ids[:6]).html()
    big = np.random.default_rng(0).standard_normal((12, 12, 1024))
    path = viewer._page(tmp_path / "two.html", "two", body + viewer.PatchingView(big).html())
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector(".ajp[data-ready='1']", timeout=20_000)
    assert page.eval_on_selector_all(".ajv", "els => els.map(e => e.dataset.ready)") == ["1", "1"]
    assert page.get_attribute(".ajp", "data-cells") == str(12 * 1024) and errors == []
    page.close()


def _edge_scores(**change):
    from attention_jax.analysis.discovery import edge_patch
    from attention_jax.analysis.patching import normalized_logit_diff
    model, _ = tiny(T=8, **change)
    clean = np.random.default_rng(0).integers(0, 64, (2, 8))
    corrupted = clean.copy()
    corrupted[:, 2] = (clean[:, 2] + 5) % 64
    return edge_patch(model, clean, corrupted, normalized_logit_diff(model, clean, corrupted, 3, 4))


@pytest.mark.slow
def test_the_circuit_view_draws_each_edge_and_reads_it_back_on_hover(browser, tmp_path):
    from attention_jax.analysis.pruning import circuit
    scores = _edge_scores()
    kept = circuit(scores, k=12)
    page, asked, errors = open_page(browser, viewer.CircuitView(scores, kept, title="<b>found</b>").save(tmp_path / "c.html"),
                                    "ajc")
    assert page.get_attribute(".ajc", "data-edges") == str(len(kept)) and len(kept) > 0
    assert page.eval_on_selector_all(".ajc-edge", "els => els.map(e => e.dataset.edge)") == kept
    # every node of the graph drawn once: the embedding, 2 blocks of 4 heads and an FFN, the logits
    assert len(page.query_selector_all(".ajc-node")) == 1 + 2 * 5 + 1
    name = kept[0]
    page.hover(f".ajc-edge[data-edge='{name}']", force=True)
    assert page.text_content(".ajc-tip") == f"{name}: {scores.effect[scores.graph.index(name)]:.4f}"
    assert "<b>found</b>" in page.text_content(".ajc") and page.query_selector(".ajc b") is None   # the title as text
    assert errors == [] and [u for u in asked if not u.startswith("file:")] == []
    page.close()


@pytest.mark.slow
def test_a_post_norm_circuit_draws_its_layer_norms_apart_from_every_other_node(browser, tmp_path):
    scores = _edge_scores(norm="post")
    page, _, errors = open_page(browser, viewer.CircuitView(scores, scores.graph.names()).save(tmp_path / "p.html"),
                                "ajc")
    nodes = page.eval_on_selector_all(".ajc-node", "gs => gs.map(g => [g.dataset.node, g.firstChild.getAttribute('cx'), "
                                                   "g.firstChild.getAttribute('cy')])")
    assert [n for n, _, _ in nodes] == [*scores.graph.senders, "logits"] and "0.ln1" in scores.graph.senders
    assert len({(x, y) for _, x, y in nodes}) == len(nodes)                 # no node drawn over another
    assert page.get_attribute(".ajc", "data-edges") == str(len(scores.graph.edges)) and errors == []
    page.close()


def test_a_circuit_view_of_edges_the_graph_lacks_is_refused_in_one_line():
    scores = _edge_scores()
    assert len(viewer.CircuitView(scores).payload()["edges"]) <= 20      # the default: the top 20's circuit
    with pytest.raises(ConfigError, match="no edge '9.h9->logits'"):
        viewer.CircuitView(scores, ["9.h9->logits"])


def test_another_kind_of_result_or_a_title_that_is_no_text_is_refused_in_one_line():
    """Each view given the result another view shows, or numbers in no array, or a title that is no
    text, said so in one line; it was a TypeError, an AttributeError or a ValueError from deep inside."""
    from attention_jax.analysis.patching import Sweep
    model, ids = tiny()
    att, scores = viewer.view(model, ids), _edge_scores()
    sweep = Sweep(np.zeros((2, 12)), ("layer", "position"), "resid_pre")
    for make, said in [(lambda: viewer.AttentionView(sweep, ids), "this is a patching sweep: show it with PatchingView"),
                       (lambda: viewer.PatchingView(att), "PatchingView shows a patching sweep .*a view already"),
                       (lambda: viewer.PatchingView(scores), "this is edge scores: draw them with CircuitView"),
                       (lambda: viewer.CircuitView(sweep), "CircuitView shows edge scores; this is a patching sweep"),
                       (lambda: viewer.CircuitView(att.weights), "CircuitView shows edge scores .*got a ndarray"),
                       (lambda: viewer.AttentionView({"a": 1}, ids), "got a dict, which holds no such numbers"),
                       (lambda: viewer.AttentionView(att.weights, 12), "tokens=12: give a list of tokens"),
                       (lambda: viewer.PatchingView(sweep, title=3), "title=3: give the view's title as text"),
                       (lambda: viewer.CircuitView(scores, title=b"x"), "title=b'x': give the view's title"),
                       (lambda: viewer.view(model, ids, title=None), "title=None: give the view's title")]:
        with pytest.raises(ConfigError, match=said) as info:
            make()
        assert "\n" not in str(info.value)
    assert viewer.PatchingView(sweep).values.shape == (2, 12)                   # its own kind: shown
