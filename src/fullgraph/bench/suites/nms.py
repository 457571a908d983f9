"""Suite `nms`: our fixed-capacity batched NMS (`fullgraph.models.nms.nms`) against torchvision's `batched_nms`.

Per box count and batch size, seeded random detections: boxes jittered around objects (about ten per object, so
NMS has real work and chains of suppression), corners on a quarter-pixel grid (see GRID), each box labelled with
its object's class (8 classes), and per image
one of CASES: distinct scores, tied scores (20 levels), or an empty image (every score at or below the threshold).
Both sides run with the same settings: the IoU threshold, the score threshold, the top-k before NMS and the capacity
(kept boxes per image). torchvision's `batched_nms` has neither threshold nor cap, so the reference is, per image:
drop the scores at or below the threshold, keep the top-k best, `batched_nms`, keep the first `capacity` survivors.

Variants: the reference (torchvision, eager, a loop over the images); ours eager; ours `torch.compile(fullgraph=True)`;
ours under CUDA graphs (`mode="reduce-overhead"`, GPU only). Per variant: first call (compile time for the compiled
ones), latency median with p20 / p80 (CUDA events or the CPU clock), and exactness per image against the reference:
the kept index sets are equal. "exact" asks that of every image without tied scores; with ties greedy NMS depends on
the order in which tied boxes are visited, which torchvision leaves unspecified, so those images are counted in
"images equal" but never make a row inexact. Graph breaks of ours: `torch._dynamo.explain` on ours uncompiled (0:
fixed shapes are what make it one graph).

Without torchvision (it does not import on a CPU-only torch here) the reference is not timed ("torchvision not
installed: reference skipped") and exactness is checked against `greedy_nms`, the textbook one-box-at-a-time loop.

Defaults: on a GPU 1000 and 10000 boxes at batch 1 and 8; on the CPU 200 boxes at batch 4 (one image of each case).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fullgraph.bench.results import Result, make_rows, measurement_metrics
from fullgraph.bench.suites import parse_sizes
from fullgraph.bench.table import format_table
from fullgraph.env import first_line
from fullgraph.errors import UsageError
from fullgraph.models.nms import NMSOutput, nms
from fullgraph.timing import benchmark, resolve_device

GPU_BOXES = (1000, 10000)
CPU_BOXES = (200,)
GPU_BATCHES = (1, 8)
CPU_BATCHES = (4,)
CASES = ("distinct", "tied", "empty")  # image i is CASES[i]; images after these have distinct scores
CLASSES = 8
IMAGE_SIDE = 512.0
BOXES_PER_OBJECT = 10
# Box corners lie on a 1/GRID-pixel grid: sides, areas and intersections are then exact in float32 (and stay exact
# when torchvision shifts each class's boxes apart), so every implementation computes the same IoU and agrees on
# which side of the threshold it falls; off the grid, a rounding difference near the threshold would flip a box.
GRID = 4

NmsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]  # torchvision's batched_nms form


@dataclass(frozen=True)
class Settings:
    """What both sides are called with."""

    iou_threshold: float = 0.5
    score_threshold: float = 0.05
    top_k: int = 1000
    capacity: int = 100

    def __post_init__(self) -> None:
        if not 0.0 <= self.iou_threshold <= 1.0:
            raise UsageError(f"--iou {self.iou_threshold}: the IoU threshold must be in [0, 1], e.g. --iou 0.5")
        if not 0.0 <= self.score_threshold < 1.0:
            raise UsageError(f"--score-threshold {self.score_threshold}: scores are drawn in (0, 1]; give a "
                             "threshold in [0, 1), e.g. --score-threshold 0.05")  # fmt: skip
        for flag, value in (("--top-k", self.top_k), ("--capacity", self.capacity)):
            if value < 1:
                raise UsageError(f"{flag} {value}: must be a positive number of boxes, e.g. {flag} 100")

    def ours(self) -> dict:
        """The settings as `nms` takes them."""
        return {"iou_threshold": self.iou_threshold, "score_threshold": self.score_threshold,
                "pre_top_k": self.top_k, "max_kept": self.capacity}  # fmt: skip


def make_inputs(n: int, batch: int, settings: Settings, *, seed: int, device: torch.device):
    """(boxes [B, N, 4] xyxy, scores [B, N], labels [B, N] int64, the case of each image), seeded."""
    g = torch.Generator().manual_seed(seed)
    objects = max(1, n // BOXES_PER_OBJECT)
    centre = torch.rand(batch, objects, 2, generator=g) * IMAGE_SIDE
    side = 16 + torch.rand(batch, objects, 2, generator=g) * 112
    cls = torch.randint(0, CLASSES, (batch, objects), generator=g)
    pick = torch.randint(0, objects, (batch, n), generator=g)  # the object each box was proposed for
    at = pick[..., None].expand(-1, -1, 2)
    obj_centre, obj_side = centre.gather(1, at), side.gather(1, at)  # [B, N, 2] each
    xy = obj_centre + torch.randn(batch, n, 2, generator=g) * obj_side * 0.15
    wh = obj_side * (1 + 0.15 * torch.randn(batch, n, 2, generator=g)).clamp(min=0.3)
    boxes = (torch.cat((xy - wh / 2, xy + wh / 2), -1) * GRID).round() / GRID  # [B, N, 4], on the grid
    labels = cls.gather(1, pick)  # [B, N]
    cases = tuple(CASES[i] if i < len(CASES) else "distinct" for i in range(batch))
    scores = torch.empty(batch, n)
    for i, case in enumerate(cases):
        if case == "distinct":
            scores[i] = (torch.randperm(n, generator=g) + 1) / (n + 1)  # no two equal
        elif case == "tied":
            scores[i] = torch.randint(1, 21, (n,), generator=g) / 20  # 20 levels: many ties
        else:  # empty: nothing passes the threshold, and the batch's shapes stay the same
            scores[i] = torch.rand(n, generator=g) * settings.score_threshold
    return boxes.to(device), scores.to(device), labels.to(device), cases


def candidates(scores: torch.Tensor, settings: Settings) -> torch.Tensor:
    """One image's indices that NMS runs over: scores above the threshold, the top-k best, best first."""
    above = (scores > settings.score_threshold).nonzero().squeeze(1)
    return above[scores[above].argsort(descending=True, stable=True)[: settings.top_k]]


def reference_keep(nms_fn: NmsFn, boxes, scores, labels, settings: Settings) -> torch.Tensor:
    """One image [N, 4], [N], [N] through `nms_fn` (torchvision's `batched_nms` form) with ours' threshold, top-k
    and capacity applied around it: the kept indices into the image, best first."""
    cand = candidates(scores, settings)
    kept = nms_fn(boxes[cand], scores[cand], labels[cand], settings.iou_threshold)
    return cand[kept[: settings.capacity]]


def greedy_nms(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy NMS one box at a time, torchvision's `batched_nms` signature: visit the boxes best first (ties by
    index), keep a box unless a kept box of the same class overlaps it with IoU > iou_threshold. The IoU is
    inter / (area_kept + area_box - inter) in float32, as torchvision computes it. -> kept indices, best first."""
    order = scores.argsort(descending=True, stable=True)
    b, c = boxes[order].float().cpu(), idxs[order].cpu()
    area = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    alive = torch.ones(len(order), dtype=torch.bool)
    kept = []
    for i in range(len(order)):
        if not alive[i]:
            continue
        kept.append(i)
        wh = (torch.minimum(b[i, 2:], b[:, 2:]) - torch.maximum(b[i, :2], b[:, :2])).clamp(min=0)
        inter = wh[:, 0] * wh[:, 1]
        alive &= ~((inter / (area[i] + area - inter) > iou_threshold) & (c == c[i]))
    return order[torch.tensor(kept, dtype=torch.int64).to(order.device)]


def kept_indices(out: NMSOutput, boxes, scores, labels) -> list[torch.Tensor | None]:
    """Ours' kept boxes as indices into each image's inputs, best first, found by box, score and label (random
    boxes do not repeat); None for an image where a kept box matches no input. All tensors on the CPU."""
    found = []
    for b in range(len(out.num_kept)):
        k = int(out.num_kept[b])
        match = ((out.boxes[b, :k, None] == boxes[b, None]).all(-1) & (out.scores[b, :k, None] == scores[b, None])
                 & (out.labels[b, :k, None] == labels[b, None]))  # fmt: skip
        found.append(match.int().argmax(1) if bool(match.any(1).all()) else None)  # [k], or None
    return found


def compare_kept(ours: torch.Tensor, ref: torch.Tensor, scores: torch.Tensor) -> str:
    """How kept indices `ours` compare with `ref` (both best first): "equal", "equal but tied boxes in another
    order", "other tied boxes kept" (the same scores in the same order) or "DIFFERENT (a vs b kept)"."""
    if torch.equal(ours, ref):
        return "equal"
    if torch.equal(scores[ours], scores[ref]):  # only boxes of equal scores differ
        same_set = torch.equal(ours.sort().values, ref.sort().values)
        return "equal but tied boxes in another order" if same_set else "other tied boxes kept"
    return f"DIFFERENT ({len(ours)} vs {len(ref)} kept)"


def has_ties(scores: torch.Tensor, score_threshold: float) -> bool:
    """Whether two of one image's scores above the threshold are equal (greedy NMS then depends on their order)."""
    above = scores[scores > score_threshold]
    return above.numel() != above.unique().numel()


SAME_SET = ("equal", "equal but tied boxes in another order")


def torchvision_reference() -> tuple[NmsFn | None, str]:
    """(torchvision's batched_nms or None, a line saying which reference the exactness column uses)."""
    try:
        import torchvision
        from torchvision.ops import batched_nms
    except ImportError:
        return None, "torchvision not installed: reference skipped; exactness against greedy_nms (one box at a time)"
    except RuntimeError as e:  # installed for another torch: its C++ ops fail to register
        return None, f"torchvision unusable ({first_line(e, 80)}): reference skipped; exactness against greedy_nms"
    return batched_nms, f"reference: torchvision {torchvision.__version__} batched_nms, per image"


def run(args) -> tuple[list[Result], str]:
    device = resolve_device(args.device)
    gpu = device.type == "cuda"
    settings = Settings(args.iou, args.score_threshold, args.top_k, args.capacity)
    counts = parse_sizes("--boxes", args.boxes, "counts like 1000,10000") if args.boxes else None
    batches = parse_sizes("--batches", args.batches, "sizes like 1,8") if args.batches else None
    counts, batches = counts or (GPU_BOXES if gpu else CPU_BOXES), batches or (GPU_BATCHES if gpu else CPU_BATCHES)
    reference, says = torchvision_reference()
    rows: list[Result] = []
    table: list[list] = []
    with torch.no_grad():
        for n in counts:
            for batch in batches:
                _point(n, batch, settings, device, reference, args.reps, rows, table)
    headers = ["point", "variant", "ms", "p20-p80", "first call s", "exact", "images equal", "graph breaks"]
    cases = ", ".join(f"{i}: {c}" for i, c in enumerate(CASES))
    head = (f"{says}\nsettings: IoU > {settings.iou_threshold}, score > {settings.score_threshold}, top-k "
            f"{settings.top_k}, capacity {settings.capacity}; images {cases} (later ones distinct)")  # fmt: skip
    return rows, head + "\n" + format_table(headers, table)


def _point(n, batch, settings: Settings, device, reference: NmsFn | None, reps: int, rows, table) -> None:
    boxes, scores, labels, cases = make_inputs(n, batch, settings, seed=n * 1000 + batch, device=device)
    cpu = [t.cpu() for t in (boxes, scores, labels)]
    kwargs = settings.ours()

    def ours(boxes, scores, labels):
        return nms(boxes, scores, labels, **kwargs)

    def per_image(nms_fn: NmsFn) -> list[torch.Tensor]:
        return [reference_keep(nms_fn, *(t[i] for t in (boxes, scores, labels)), settings) for i in range(batch)]

    explained = torch._dynamo.explain(ours)(boxes, scores, labels)  # resets Dynamo's caches: before compiling
    variants: dict[str, Callable[[], object]] = {}
    if reference is not None:
        variants["torchvision, eager"] = lambda: per_image(reference)
    variants["ours, eager"] = lambda: ours(boxes, scores, labels)
    compiled = {"ours, compiled": torch.compile(ours, fullgraph=True, dynamic=False)}
    if device.type == "cuda":
        compiled["ours, CUDA graphs"] = torch.compile(ours, fullgraph=True, dynamic=False, mode="reduce-overhead")
    variants |= {name: (lambda fn=fn: fn(boxes, scores, labels)) for name, fn in compiled.items()}
    if reference is not None:
        expected = [k.cpu() for k in per_image(reference)]
    else:
        expected = [reference_keep(greedy_nms, *(t[i] for t in cpu), settings) for i in range(batch)]
    tied = [has_ties(cpu[1][i], settings.score_threshold) for i in range(batch)]
    point = f"n{n} b{batch}"
    params = {"boxes": n, "batch": batch, "cases": ",".join(cases), "iou_threshold": settings.iou_threshold,
              "score_threshold": settings.score_threshold, "top_k": settings.top_k, "capacity": settings.capacity,
              "reference": "torchvision" if reference is not None else "greedy_nms"}  # fmt: skip
    for name, fn in variants.items():
        m = benchmark(fn, device=device, warmup=3, reps=reps)
        metrics = measurement_metrics(m)
        exact, equal, breaks = "-", "-", None
        if name.startswith("ours"):
            out = NMSOutput(*(t.cpu() for t in fn()))  # copied at once: a CUDA graph's replay reuses its outputs
            verdicts = [compare_kept(k, e, cpu[1][i]) if k is not None else "DIFFERENT (a box not in the input)"
                        for i, (k, e) in enumerate(zip(kept_indices(out, *cpu), expected, strict=True))]  # fmt: skip
            wrong = sorted({v for v, t in zip(verdicts, tied, strict=True) if not t and v not in SAME_SET})
            ok, same = not wrong, sum(v in SAME_SET for v in verdicts)
            exact, equal = "yes" if ok else "NO: " + "; ".join(wrong), f"{same}/{batch}"
            metrics |= {"exact": (float(ok), ""), "images_equal": (float(same), ""),
                        "converged": (float(out.converged.all()), "")}  # fmt: skip
        if name in compiled:
            breaks = explained.graph_break_count
            metrics |= {"graph_breaks": (float(breaks), ""), "graphs": (float(explained.graph_count), "")}
        rows += make_rows("nms", point, name, metrics, params)
        t = m.timing
        table.append([point, name, t.median_ms, f"{t.p20_ms:.3f}-{t.p80_ms:.3f}", m.first_call_s, exact, equal, breaks])
