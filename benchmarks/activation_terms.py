"""Issue #33: the activations a GPT layer keeps for its backward, term by term, against
Korthikanti et al. 2022 (arXiv 2205.05198) §4's formula: 34·s·b·h + 5·a·s²·b bytes a layer
without tensor parallelism (Table 2: s·b·h·(10 + 24/t + 5·a·s/(h·t)) over t devices without
sequence parallelism, 34·s·b·h/t with SP and selective recompute).

Each term of the paper (§4.1: attention 11·s·b·h + 5·a·s²·b, MLP 19·s·b·h, the two LayerNorms
4·s·b·h; 16-bit values, 1-byte dropout masks) is set against the tensors of one layer of the
plan that a rank holds when its backward starts (`kept_at_backward`: the plan's buffers,
`search.buffers`, replayed up to the first backward instruction of a block; a row of one
pipeline stage, where every layer's forward is done by then). A copy a redistribution made for
a consumer (``tensor>op``) is shown as such: `autostrat estimate` counts it under communication
buffers, not activations (`search.memory_breakdown`).

The GPT configs drop as Megatron-LM's defaults do (``--attention-dropout 0.1``,
``--hidden-dropout 0.1``: `published`'s docstring), so every term of the paper has its tensor:
a Dropout's output and its 1-byte bool mask, which the forward writes and its backward reads
(`autodiff.elementwise`; under recompute the recomputed forward writes it again). Measured
2026-12-04 (the 22B row, load 1-2): a layer keeps exactly the paper's terms, without SP
(10 + 24/t + 5·a·s/(h·t))·s·b·h, and with SP + selective 34/t (1.000 both, no copy): each
LayerNorm output is kept as its sequence's part and gathered again in the backward for the
weight gradients, as Megatron's is (``backward_regathers``,
`models.megatron_plan.weight_gradient_seeds`). Before that, SP + selective kept 30/t of 34/t
and a gathered copy of each LayerNorm output (2·s·b·h) for the backward.

Run through `benchmarks/published.py --terms`.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from published_runs import ROOT, estimated  # first: it puts the repository on sys.path

from autostrat.autodiff import op_phase  # noqa: E402
from autostrat.cost.live_bytes import LiveBytes, release_after  # noqa: E402
from autostrat.search.buffers import device_program  # noqa: E402
from autostrat.tables import format_table  # noqa: E402

# Per term of §4.1: (name, s·b·h units or None, a·s²·b units or None, split over t without SP,
# dropped by selective recompute, tensors of layer L it is (their names after "blocks.L.";
# "previous:" a tensor of layer L - 1)).
TERMS = (
    ("LayerNorm 1 input", 2, None, False, False, ("previous:residual2:0",)),
    ("QKV input (LayerNorm 1 output)", 2, None, False, False, ("ln1.layer_norm:0",)),
    ("Q and K (QKᵀ inputs)", 4, None, True, False, ("attention.to_heads:0", "attention.to_heads_1:0")),
    ("softmax output", None, 2, True, True, ("attention.softmax:0",)),
    ("softmax dropout mask", None, 1, True, True, ("attention.probs_dropout:1",)),
    ("softmax dropout output", None, 2, True, True, ("attention.probs_dropout:0",)),
    ("V", 2, None, True, False, ("attention.to_heads_2:0",)),
    ("projection input", 2, None, True, False, ("attention.merge_heads:0",)),
    ("attention dropout mask", 1, None, False, False, ("dropout1:1",)),
    ("LayerNorm 2 input", 2, None, False, False, ("residual1:0",)),
    ("MLP input (LayerNorm 2 output)", 2, None, False, False, ("ln2.layer_norm:0",)),
    ("GeLU input", 8, None, True, False, ("ffn1.bias_add:0",)),
    ("GeLU output", 8, None, True, False, ("ffn1.activation.gelu:0",)),
    ("MLP dropout mask", 1, None, False, False, ("dropout2:1",)),
)


def kept_at_backward(plan) -> dict[str, int]:
    """The buffers (key: bytes) one rank of `plan` holds when the first backward instruction of
    a block (an op named ``...blocks.N...``) is about to run."""
    program = device_program(plan)
    events = [event for event in program.events if not event.output]
    memory = LiveBytes()
    for event, released in zip(events, release_after((event.touched for event in events), program.kept)):
        if event.owner and op_phase(event.owner) == "backward" and "blocks." in event.owner:
            break
        memory.write(event.writes, event.over, released)
        memory.release(released)
    return dict(memory.sizes)


def paper_bytes(term, s: int, b: int, h: int, a: int, t: int, sequence_parallel: bool, selective: bool) -> float:
    """Bytes of one `TERMS` entry per device by Korthikanti et al.'s formula (module docstring)."""
    _, units, square_units, split, recomputed, _ = term
    if selective and recomputed:
        return 0.0
    value = (units or 0) * s * b * h + (square_units or 0) * a * s * s * b
    return value / t if split or sequence_parallel else value


def model_bytes(term, kept: dict[str, int], layer: int) -> tuple[int, int]:
    """(activation bytes, copies' bytes) of `kept` that are `term`'s tensors in layer `layer`."""
    names = [f"blocks.{layer - 1}.{name.split(':', 1)[1]}" if name.startswith("previous:") else f"blocks.{layer}.{name}"
             for name in term[5]]
    own = sum(size for key, size in kept.items() if key in names)
    copies = sum(size for key, size in kept.items() if ">" in key and key.split(">", 1)[0] in names)
    return own, copies


def terms_table(plan, shape: dict, t: int, sequence_parallel: bool, selective: bool, layer: int = 1) -> str:
    """Per term, the paper's bytes and the plan's (activations, and copies for a consumer) of
    layer `layer`, in units of s·b·h bytes, and the totals; `shape`: s, b, h, a."""
    s, b, h, a = shape["s"], shape["b"], shape["h"], shape["a"]
    kept, unit = kept_at_backward(plan), s * b * h
    lines, totals = [], [0.0, 0, 0]
    for term in TERMS:
        paper = paper_bytes(term, s, b, h, a, t, sequence_parallel, selective)
        own, copies = model_bytes(term, kept, layer)
        totals = [totals[0] + paper, totals[1] + own, totals[2] + copies]
        lines.append([term[0], f"{paper / unit:.3f}", f"{own / unit:.3f}", f"{copies / unit:.3f}",
                      "" if not term[5] else ", ".join(term[5])])
    lines.append(["layer total", f"{totals[0] / unit:.3f}", f"{totals[1] / unit:.3f}", f"{totals[2] / unit:.3f}",
                  f"activations / paper {totals[1] / totals[0]:.3f}"])
    return format_table(["term", "paper (s·b·h)", "activations (s·b·h)", "copies (s·b·h)", "tensors"], lines)


def print_terms(rows) -> None:
    """Per one-stage row (pp 1: every layer's forward done when the backward starts), layer 1's
    activations term by term against the paper's (`activation_terms`), without SP and
    recompute, and with SP + selective recompute."""
    with tempfile.TemporaryDirectory(prefix="autostrat-terms-") as work:
        for row in (row for row in rows if row.pp == 1):
            config = json.loads((ROOT / "configs" / "models" / row.model).read_text())
            shape = {"s": 2048, "b": row.micro_batch, "h": config["n_embd"], "a": config["n_head"]}
            for name, choices, both in (("no SP, no recompute", {"recompute": "none"}, False),
                                        ("SP + selective recompute", {"recompute": "full", "selective": True}, True)):
                found = estimated(row, Path(work), f"terms_{both}", **choices)
                print(f"\n{row.name}, {name}: layer 1's activations when the backward starts, per device "
                      f"(s·b·h = {2048 * row.micro_batch * config['n_embd']:,} bytes; `activation_terms`):")
                print(terms_table(found.plan, shape, row.tp, both, both), flush=True)
