"""The lineage picture: a layered drawing of a LineageGraph, server-rendered as SVG
(the lineage page, and small, the approvals inbox).

Columns are the closure's layers (longest path from the root), inputs in front; rows
are ordered by the barycentre of their upstreams to keep edges short. Everything is
computed from LineageGraph.cached() in memory: the picture costs no query per node."""
from __future__ import annotations

from dataclasses import dataclass, field

from backfill_portal.catalog.kinds import has_side_effects
from backfill_portal.catalog.lineage import LineageGraph
from backfill_portal.catalog.models import Dataset

LINEAGE_MAX_NODES = 400
_SIZES = {
    False: {"w": 232, "h": 66, "gx": 72, "gy": 18, "pad": 14, "chars": 29},
    True: {"w": 156, "h": 30, "gx": 36, "gy": 8, "pad": 6, "chars": 21},
}
ACTION_LABELS = {"target": "target", "rebuild": "rebuild", "skip": "skipped", "handoff": "hand-off"}


@dataclass
class PictureBox:
    key: str  # the job name, or "dataset:<name>" for an input dataset
    kind: str  # job | side_effect | source | upstream
    job: str
    dataset: str
    owner: str
    grain: str
    timezone: str
    layer: int  # -1: an input of the picture
    reads: tuple[str, ...] = ()
    action: str = ""  # target | rebuild | skip | handoff | untouched | "" (no request shown)
    col: int = 0
    row: int = 0
    x: int = 0
    y: int = 0
    lines: tuple[tuple[int, str, str], ...] = ()  # (y, css class, text)
    shape: str = ""  # the SVG path / polygon points for non-rectangular shapes
    text_x: int = 0
    badge_x: int = 0
    badge_y: int = 0

    @property
    def touched(self) -> bool:
        return self.action in ("target", "rebuild")

    @property
    def action_label(self) -> str:
        return ACTION_LABELS.get(self.action, "")

    @property
    def tooltip(self) -> str:
        what = {"job": "job", "side_effect": "side-effect node", "source": "source dataset",
                "upstream": "upstream dataset"}[self.kind]
        parts = [f"{self.job or self.dataset} ({what})"]
        if self.job and self.dataset != self.job:
            parts.append(f"produces {self.dataset}")
        parts.append(f"owner {self.owner or '?'}, {self.grain or '?'} grain, {self.timezone or '?'}")
        if self.action_label:
            parts.append(f"in this request: {self.action_label}")
        return "; ".join(parts)


@dataclass
class PictureEdge:
    d: str
    touched: bool
    skipped: bool


@dataclass
class LineagePicture:
    uid: str
    compact: bool
    boxes: list[PictureBox]
    edges: list[PictureEdge]
    width: int
    height: int
    w: int
    h: int
    title: str
    desc: str
    root: str | None
    request: object | None
    truncated: int = 0
    legend: list[str] = field(default_factory=list)

    @property
    def jobs(self) -> list[PictureBox]:
        return [b for b in self.boxes if b.kind in ("job", "side_effect")]


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _request_actions(req) -> dict[str, str]:
    if req is None:
        return {}
    actions = dict(req.node_actions or {})
    actions[req.job.name] = "target"
    return actions


def lineage_picture(graph: LineageGraph, *, root: str | None = None, req=None, compact: bool = False,
                    uid: str = "lineage", inputs: dict[str, tuple] | None = None) -> LineagePicture:
    """Lay out the closure of `root` (or the whole catalog) as boxes and edges.

    `inputs` maps input dataset names to (owner, grain, timezone, is_source), read by the
    caller in one query (see lineage_inputs); compact pictures draw no inputs."""
    jobs = graph.jobs
    if req is not None and not root:
        root = req.job.name
    if root:
        closure = graph.walk(root)
        names, layer = closure.order, dict(closure.layer)
    else:
        names = sorted(jobs, key=graph.topo_index.__getitem__)
        layer = {}
        for name in names:
            layer[name] = max((layer[u] + 1 for u in graph.upstream_jobs[name]), default=0)
    truncated = max(0, len(names) - LINEAGE_MAX_NODES)
    names = names[:LINEAGE_MAX_NODES]
    shown = set(names)
    actions = _request_actions(req)
    boxes: dict[str, PictureBox] = {}
    for name in names:
        job = jobs[name]
        action = (actions.get(name) or "untouched") if req is not None else ""
        boxes[name] = PictureBox(key=name, kind="side_effect" if has_side_effects(job.kind) else "job", job=name,
                                 dataset=job.dataset, owner=job.owner, grain=job.grain, timezone=job.timezone,
                                 layer=layer[name], reads=job.reads, action=action)
    input_names = sorted(inputs or {})
    for ds in input_names:
        owner, grain, tz, is_source = inputs[ds]
        boxes["dataset:" + ds] = PictureBox(key="dataset:" + ds, kind="source" if is_source else "upstream", job="",
                                            dataset=ds, owner=owner, grain=grain, timezone=tz, layer=-1)
    offset = 1 if input_names else 0
    columns: dict[int, list[str]] = {}
    for key, box in boxes.items():
        box.col = box.layer + offset
        columns.setdefault(box.col, []).append(key)
    preds: dict[str, list[str]] = {k: [] for k in boxes}
    edges_raw: list[tuple[str, str]] = []
    for name in names:
        for up in graph.upstream_jobs[name]:
            if up in shown:
                edges_raw.append((up, name))
        for ds in jobs[name].reads:
            if "dataset:" + ds in boxes:
                edges_raw.append(("dataset:" + ds, name))
    for a, b in edges_raw:
        preds[b].append(a)
    _order_rows(columns, preds)

    size = _SIZES[compact]
    w, h, gx, gy, pad = size["w"], size["h"], size["gx"], size["gy"], size["pad"]
    badges = 10 if not compact and req is not None else 0  # room for the action badges
    tallest = max((len(keys) for keys in columns.values()), default=1)
    height = pad * 2 + tallest * h + (tallest - 1) * gy + badges
    ncols = max(columns, default=0) + 1
    width = pad * 2 + ncols * w + (ncols - 1) * gx
    top = pad + badges
    for col, keys in columns.items():
        span = len(keys) * h + (len(keys) - 1) * gy
        y0 = top + (tallest * h + (tallest - 1) * gy - span) // 2
        for row, key in enumerate(keys):
            box = boxes[key]
            box.row, box.x, box.y = row, pad + col * (w + gx), y0 + row * (h + gy)
            box.shape = _box_shape(box, w, h)
            box.text_x = box.x + (16 if box.kind == "side_effect" else 10)
            lines = _box_lines(box, compact=compact, chars=size["chars"])
            if compact:
                box.lines = ((box.y + h // 2 + 4, "t1", lines[0]),)
            else:
                box.lines = tuple(zip((box.y + 22, box.y + 40, box.y + 56), ("t1", "t2", "t3"), lines))
            box.badge_x, box.badge_y = box.x + w - 74, box.y - 9
    edges = []
    for a, b in edges_raw:
        ua, ub = boxes[a], boxes[b]
        x1, y1 = ua.x + w, ua.y + h // 2
        x2, y2 = ub.x - 2, ub.y + h // 2
        mid = (x1 + x2) // 2
        edges.append(PictureEdge(d=f"M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}",
                                 touched=ub.touched and (ua.touched or ua.kind in ("source", "upstream")),
                                 skipped=ub.action == "skip"))
    ordered = sorted(boxes.values(), key=lambda bx: (bx.col, bx.row))
    title, desc = _describe(ordered, root=root, req=req, truncated=truncated)
    legend = ["job", "side_effect"] + (["source"] if input_names else [])
    if req is not None:
        legend += ["target", "rebuild", "skip", "handoff", "untouched"]
    return LineagePicture(uid=uid, compact=compact, boxes=ordered, edges=edges, width=width, height=height, w=w, h=h,
                          title=title, desc=desc, root=root, request=req, truncated=truncated, legend=legend)


def _order_rows(columns: dict[int, list[str]], preds: dict[str, list[str]]) -> None:
    """Barycentre ordering, two sweeps: a node sits near the mean row of its upstreams."""
    for _ in range(2):
        position: dict[str, float] = {}
        for col in sorted(columns):
            keys = columns[col]
            if col > 0:
                def bary(item, keys=keys):
                    i, key = item
                    rows = [position[p] for p in preds[key] if p in position]
                    return (sum(rows) / len(rows) if rows else float(i), i)

                keys[:] = [k for _, k in sorted(enumerate(keys), key=bary)]
            for i, key in enumerate(keys):
                position[key] = i - (len(keys) - 1) / 2  # centred like the drawing


def _box_lines(box: PictureBox, *, compact: bool, chars: int) -> tuple[str, ...]:
    if compact:
        return (_clip(box.job or box.dataset, chars),)
    if box.kind in ("source", "upstream"):
        return (_clip(box.dataset, chars), "source" if box.kind == "source" else "upstream dataset",
                _clip(f"{box.owner} · {box.grain} · {box.timezone}", chars + 4))
    first = box.job + (" ⚑" if box.kind == "side_effect" else "")
    return (_clip(first, chars), _clip("▸ " + box.dataset, chars + 3),
            _clip(f"{box.owner} · {box.grain} · {box.timezone}", chars + 4))


def _box_shape(box: PictureBox, w: int, h: int) -> str:
    x, y = box.x, box.y
    if box.kind == "side_effect":  # a hexagon: pointed ends read as "goes outside"
        e = min(14, h // 3)
        return f"{x + e},{y} {x + w - e},{y} {x + w},{y + h // 2} {x + w - e},{y + h} {x + e},{y + h} {x},{y + h // 2}"
    if box.kind in ("source", "upstream"):  # a cylinder
        ry = 6
        return (f"M{x},{y + ry} A{w // 2},{ry} 0 0 1 {x + w},{y + ry} V{y + h - ry} "
                f"A{w // 2},{ry} 0 0 1 {x},{y + h - ry} Z M{x},{y + ry} A{w // 2},{ry} 0 0 0 {x + w},{y + ry}")
    return ""


def _describe(boxes: list[PictureBox], *, root, req, truncated: int) -> tuple[str, str]:
    jobs = [b for b in boxes if b.kind in ("job", "side_effect")]
    layers = len({b.layer for b in jobs})
    title = (f"Lineage of {root}" if root else "Lineage of the whole catalog") + (
        f", highlighting request #{req.pk}" if req is not None else "")
    parts = [f"{len(jobs)} job(s) in {layers} layer(s), drawn left to right from upstream to downstream."]
    inputs = [b.dataset for b in boxes if b.kind in ("source", "upstream")]
    if inputs:
        parts.append("Inputs: " + ", ".join(inputs) + ".")
    effects = [b.job for b in jobs if b.kind == "side_effect"]
    if effects:
        parts.append("Side-effect nodes: " + ", ".join(effects) + ".")
    if req is not None:
        touched = [f"{b.job} ({b.action_label})" for b in jobs if b.action_label]
        parts.append(f"Request #{req.pk} touches: " + (", ".join(touched) or "nothing") + ".")
    if truncated:
        parts.append(f"{truncated} more job(s) not drawn.")
    return title, " ".join(parts)


def lineage_inputs(graph: LineageGraph, root: str | None) -> dict[str, tuple]:
    """The datasets a picture starts from: the root's inputs, or every source the
    catalog reads. One query for their owner, grain and timezone."""
    if root:
        names = set(graph.jobs[root].reads)
    else:
        produced = {j.dataset for j in graph.jobs.values()}
        names = {d for j in graph.jobs.values() for d in j.reads if d not in produced}
    if not names:
        return {}
    rows = Dataset.objects.filter(name__in=names).values_list("name", "owner__username", "grain", "timezone",
                                                              "is_source")
    return {name: (owner, grain, tz, is_source) for name, owner, grain, tz, is_source in rows}
