r"""The engine of the experiment of :mod:`attnopt.course.vqa`: the optimization loops of
:func:`~attnopt.course.vqa.pretrain_encoder` and :func:`~attnopt.course.vqa.train` (with the auxiliary loss of
attention supervision), the fits of :func:`~attnopt.course.vqa.selection_sweep`, the accuracy tables, a
progress bar and a block in eval mode.

Both training loops use Adam(W) with a one-cycle learning rate (Smith and Topin, 2019) over
shuffled minibatches; their losses stay on the device and are read once per epoch.

References:
    Smith, L. N. and Topin, N. (2019). Super-convergence: very fast training of neural networks
    using large learning rates (the one-cycle schedule).
    Farinhas (2021), §6.3.1 (test-time selection of the number of components).
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ._vqa_maps import on_image
from ._vqa_scenes import ANSWER_TYPES, FAMILIES, cell_targets
from ..continuous.mixture import select_components


class Progress:
    """A text progress bar on stderr (tqdm's, when installed), or nothing."""

    def __init__(self, total: int, desc: str, enabled: bool):
        self.bar = None
        if enabled:
            try:
                from tqdm.std import tqdm
            except ImportError:  # pragma: no cover - tqdm is a dependency of the course
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, desc=desc, leave=False, file=sys.stderr, mininterval=0.5)

    def update(self, n: int = 1):
        if self.bar is not None:
            self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()


class OneCycle:
    """An optimizer with a one-cycle learning rate over ``epochs`` passes of ``steps`` minibatches."""

    def __init__(self, optimizer: torch.optim.Optimizer, lr: float, epochs: int, steps: int):
        self.optimizer = optimizer
        self.schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, lr, total_steps=epochs * steps, pct_start=0.2)

    def step(self, loss: torch.Tensor) -> None:
        """One gradient step on ``loss`` and one step of the learning rate."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.schedule.step()


def gather_scenes(features: torch.Tensor, scene: torch.Tensor) -> torch.Tensor:
    """``features[scene]`` for an integer tensor ``scene`` of any shape, by ``index_select`` (a copy of
    whole rows, several times faster on a CPU than advanced indexing with a multi-dimensional index)."""
    rows = features.index_select(0, scene.reshape(-1).to(features.device))
    return rows.view(*scene.shape, *features.shape[1:])


def adamw(params, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW, fused (one kernel over every parameter, on the CPU as on CUDA) where this PyTorch has it.

    The models are small: the step of the per-parameter AdamW is mostly the overhead of its many
    small operators, about a fifth of a VQA training step on a CPU.  The fused step computes the
    same update (up to rounding)."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError, ValueError):  # pragma: no cover - an older PyTorch or device without it
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` in eval mode inside the block; its training mode is restored after."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


def pretrain_epochs(encoder, data, epochs, batch_size, lr, object_weight, seed, progress) -> dict[str, list]:
    """The loop of :func:`~attnopt.course.vqa.pretrain_encoder` on checked arguments."""
    dev = encoder.coords.device
    n = data.n_scenes
    steps = math.ceil(n / batch_size)
    opt = OneCycle(torch.optim.Adam(encoder.parameters(), lr=lr), lr, epochs, steps)
    g = torch.Generator().manual_seed(seed)
    encoder.train()
    history = {"loss": []}
    bar = Progress(epochs * steps, "encoder", progress)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g).to(data.images.device)
        total = torch.zeros((), device=dev)
        for s in range(0, n, batch_size):
            idx = perm[s:s + batch_size]
            colour_t, shape_t = (t.to(dev) for t in cell_targets(data, idx, encoder.grid))
            weight = 1.0 + object_weight * (1.0 - colour_t[:, -1:])
            colour, shape = encoder.logits(data.images[idx].to(dev))
            loss = -(weight * colour_t * F.log_softmax(colour, 1)).sum(1).mean() \
                - (weight * shape_t * F.log_softmax(shape, 1)).sum(1).mean()
            opt.step(loss)
            total += loss.detach() * len(idx)
            bar.update()
        history["loss"].append(float(total) / n)
    bar.close()
    encoder.eval()
    return history


def train_epochs(model, data, features, epochs, batch_size, lr, weight_decay, seed, progress,
                 auxiliary_loss: Callable | None, on_epoch: Callable | None = None) -> dict[str, list]:
    """The loop of :func:`~attnopt.course.vqa.train` on checked arguments; ``auxiliary_loss(output, idx)``
    (or ``None``) is added to the cross-entropy of the questions ``idx``; ``on_epoch(epoch, model)``
    (or ``None``) runs after each epoch, in eval mode and without gradient."""
    dev = model.device_marker.device
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    n = len(data)
    steps = math.ceil(n / batch_size)
    opt = OneCycle(adamw(model.parameters(), lr, weight_decay), lr, epochs, steps)
    history: dict[str, list] = {"loss": [], "accuracy": [], "epoch_time": [], "on_epoch": []}
    bar = Progress(epochs * steps, model.head_name, progress)
    model.train()
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        perm = torch.randperm(n, generator=g).to(data.answers.device)
        total_loss, correct = torch.zeros((), device=dev), torch.zeros((), device=dev)
        for s in range(0, n, batch_size):
            idx = perm[s:s + batch_size]
            out = model(gather_scenes(features, data.scene[idx]).to(dev), data.questions[idx].to(dev))
            y = data.answers[idx].to(dev)
            loss = F.cross_entropy(out.logits, y)
            if auxiliary_loss is not None:
                loss = loss + auxiliary_loss(out, idx)
            opt.step(loss)
            total_loss += loss.detach() * len(idx)
            correct += (out.logits.argmax(-1) == y).sum()
            bar.update()
        history["loss"].append(float(total_loss) / n)
        history["accuracy"].append(float(correct) / n)
        history["epoch_time"].append(time.perf_counter() - t0)
        history["on_epoch"].append(None if on_epoch is None else _observe(model, epoch, on_epoch))
    bar.close()
    model.eval()
    return history


def train_jointly(models, data, features, epochs, batch_size, lr, weight_decay, seeds, progress,
                  on_epoch: Callable | None = None) -> list[dict[str, list]]:
    """The loop of :func:`~attnopt.course.vqa.train_seeds` on checked arguments: ``models[i]`` trained as
    :func:`train_epochs` trains it with ``seeds[i]`` (no auxiliary loss), all in one loop.

    Each model keeps its own shuffling generator, its own optimizer state and its own batch-norm
    statistics; what they share is one call of the head per step on the rows of every model
    stacked, ``(M*B, L)`` scores and ``(M*B, L, d)`` features.  The heads have no parameters and
    act row by row, so every model gets the gradient it would get alone; the stacking only spares
    ``M - 1`` of the head's many small operator calls per step, where most of the time goes on a CPU.
    One AdamW over all the parameters is ``M`` independent AdamWs (its update is elementwise and
    every model follows the same one-cycle schedule)."""
    head, dev = models[0].attention, models[0].device_marker.device
    n, m = len(data), len(models)
    steps = math.ceil(n / batch_size)
    params = [p for model in models for p in model.parameters()]
    opt = OneCycle(adamw(params, lr, weight_decay), lr, epochs, steps)
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    torch.manual_seed(seeds[0])
    histories = [{"loss": [], "accuracy": [], "epoch_time": [], "on_epoch": []} for _ in models]
    bar = Progress(epochs * steps, f"{models[0].head_name} x{m}", progress)
    for model in models:
        model.train()
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        perms = [torch.randperm(n, generator=g).to(data.answers.device) for g in generators]
        total_loss = torch.zeros(m, device=dev)
        correct = torch.zeros(m, device=dev)
        for s in range(0, n, batch_size):
            rows = torch.stack([perm[s:s + batch_size] for perm in perms])  # (M, B)
            idx = list(rows)
            h = gather_scenes(features, data.scene[rows]).to(dev)  # (M, B, L, d)
            y = data.answers[rows].to(dev)  # (M, B)
            encoded = [model.encode_question(data.questions[i].to(dev)) for model, i in zip(models, idx)]
            query = torch.stack([e[0] for e in encoded]).to(h.dtype)  # (M, B, d)
            scores = torch.einsum("mbld,mbd->mbl", h, query)
            if head is None:  # discrete attention
                context = torch.einsum("mbl,mbld->mbd", torch.softmax(scores, -1), h)
            else:  # one call of the head on the M*B rows
                context = head(scores.flatten(0, 1), h.flatten(0, 1)).unflatten(0, (m, -1))
            logits = torch.stack([model.classify(c, e[1]) for model, c, e in zip(models, context, encoded)])
            losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(m, -1).mean(-1)
            opt.step(losses.sum())  # the models share no parameter: each gets its own loss's gradient
            total_loss += losses.detach() * y.shape[1]
            correct += (logits.argmax(-1) == y).sum(-1)
            bar.update()
        seconds = time.perf_counter() - t0
        for k, (model, history) in enumerate(zip(models, histories)):
            history["loss"].append(float(total_loss[k]) / n)
            history["accuracy"].append(float(correct[k]) / n)
            history["epoch_time"].append(seconds / m)
            history["on_epoch"].append(None if on_epoch is None else _observe(model, epoch, on_epoch))
    bar.close()
    for model in models:
        model.eval()
    return histories


def mask_supervision(data, beta: float) -> Callable | None:
    r"""The auxiliary loss of :func:`~attnopt.course.vqa.train` with weight ``beta`` (``None`` for 0):
    ``loss(output, idx)`` is :math:`-\beta\log\sum_{c\in M}a_c`, averaged over the questions ``idx``
    of ``data``, with :math:`a` the head's own attention at the grid's resolution and :math:`M` the
    ground-truth grid mask."""
    if beta == 0:
        return None

    def loss(out, idx):
        attention = on_image(out.attention, out.attention.grid)
        on_mask = (attention * data.index(idx).grid_masks.to(out.logits.device)).sum((-2, -1))
        return -beta * torch.log(on_mask.clamp_min(1e-12)).mean()

    return loss


def _observe(model, epoch, on_epoch):
    """``on_epoch(epoch, model)`` in eval mode and without gradient; training mode restored."""
    with eval_mode(model), torch.no_grad():
        return on_epoch(epoch, model)


def summary(correct, types, families, precision) -> dict[str, float]:
    """Accuracy overall, per answer type and per question family (``nan`` where absent), the mean
    attention precision (unless ``None``) and the number of questions."""
    res = {"overall": correct.mean().item()}
    for k, name in enumerate(ANSWER_TYPES):
        sel = types == k
        res[name] = correct[sel].mean().item() if sel.any() else float("nan")
    for k, (name, _, _) in enumerate(FAMILIES):
        sel = families == k
        res[name] = correct[sel].mean().item() if sel.any() else float("nan")
    if precision is not None:
        res["attention_precision"] = precision.mean().item()
    res["n"] = int(correct.numel())
    return res


def sweep_penalties(model, data, features, penalties, k_max, n_init, n_iter, cov_floor, seed,
                    batch_size) -> dict[float, dict]:
    """The table of :func:`~attnopt.course.vqa.selection_sweep` on checked arguments: for each penalty, the
    accuracies of the model (run in eval mode) with its :math:`K^\\star`, and their shares."""
    generator = torch.Generator(device=model.device_marker.device).manual_seed(seed)
    with eval_mode(model):
        fits = _fit_penalties(model, data, features, penalties, k_max, n_init, n_iter, cov_floor, generator,
                              batch_size)
    table = {}
    for p, (ks, correct) in fits.items():
        res = summary(correct.float(), data.answer_types.cpu(), data.families.cpu(), None)
        res["k_star_shares"] = [float((ks == k).float().mean()) for k in range(1, k_max + 1)]
        table[p] = res
    return table


def _fit_penalties(model, data, features, penalties, k_max, n_init, n_iter, cov_floor, generator,
                   batch_size) -> dict[float, tuple[torch.Tensor, torch.Tensor]]:
    """The fits of :func:`~attnopt.course.vqa.selection_sweep` on checked arguments (model in eval mode):
    for each penalty, ``(K*, correct)`` per question, on the CPU."""
    head = model.attention
    dev = model.device_marker.device
    k_star = {p: [] for p in penalties}
    correct = {p: [] for p in penalties}
    for s in range(0, len(data), batch_size):
        b = data.index(slice(s, s + batch_size))
        h, questions = gather_scenes(features, b.scene).to(dev), b.questions.to(dev)
        query, q = model.encode_question(questions)
        weights = torch.softmax(torch.einsum("bld,bd->bl", h, query.to(h.dtype)), -1)
        fits = select_components(head.locations.to(weights), weights, k_max, penalties[0], n_init, n_iter,
                                 cov_floor=cov_floor, generator=generator)
        B = torch.einsum("bld,ln->bdn", h, head.ridge_operator.to(h))
        for p in penalties:
            chosen = fits.with_penalty(p)
            r = chosen.density.expected_basis(head.basis)
            logits = model.classify((B @ r.unsqueeze(-1)).squeeze(-1), q)
            k_star[p].append(chosen.n_components.cpu())
            correct[p].append((logits.argmax(-1) == b.answers.to(dev)).cpu())
    return {p: (torch.cat(k_star[p]), torch.cat(correct[p])) for p in penalties}
