"""The learner on its device (`learner.device`): what it publishes and checkpoints is on the CPU whatever it
trains on, a backend's own model stays where the backend put it, and on CUDA an update matches the CPU's."""

import torch

from learner.losses import clipped_ratio_loss
from learner.stage import LearnerStage
from learner.trainer import Trainer, published_weights
from pipeline.config import LearnerSection
from pipeline.profiling import RULE_CUDA, Profiler
from tests.cuda import needs_cuda

from .toy_model import BigramModel
from .toy_model import toy_group as _group


def _tensors(state):
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, dict):
        for value in state.values():
            yield from _tensors(value)
    elif isinstance(state, list | tuple):
        for value in state:
            yield from _tensors(value)


def test_the_cpu_learner_is_placed_and_its_state_round_trips():
    model = BigramModel()
    trainer = Trainer(model, LearnerSection(lr=0.05, device="cpu", ema=0.5), clipped_ratio_loss)
    assert trainer.device == torch.device("cpu")
    trainer.update([_group(model, 0, [1.0, 0.0])])
    state = trainer.state_dict()
    assert all(t.device.type == "cpu" for t in _tensors(state))
    again = Trainer(BigramModel(seed=9), LearnerSection(lr=0.05, device="cpu", ema=0.5), clipped_ratio_loss)
    again.load_state_dict(state)
    assert torch.equal(again.published()["table.weight"], published_weights(state)["table.weight"])
    batch = [_group(model, 1, [1.0, 0.0])]
    a, _ = trainer.update(batch)
    b, _ = again.update(batch)
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # the optimizer state came back exactly


class _Wrapped:
    """A backend's trainable model that is not a torch Module (as vllm's wrapper): the trainer cannot move it."""

    def __init__(self) -> None:
        self.inner = BigramModel()

    def parameters(self):
        return self.inner.parameters()

    def state_dict(self):
        return self.inner.state_dict()

    def train(self, mode=True):
        return self.inner.train(mode)

    def completion_logprobs(self, *args, **kwargs):
        return self.inner.completion_logprobs(*args, **kwargs)


def test_a_model_that_is_not_a_module_stays_where_its_backend_put_it():
    trainer = Trainer(_Wrapped(), LearnerSection(lr=0.05, device="auto"), clipped_ratio_loss)
    assert trainer.device == torch.device("cpu")  # its parameters' device, whatever auto says


@needs_cuda
def test_a_cuda_update_matches_the_cpu_update_and_publishes_cpu_tensors():
    cpu_model, cuda_model = BigramModel(seed=1), BigramModel(seed=1)
    batch = [_group(cpu_model, g, [1.0, 0.0, 0.0, 1.0]) for g in range(3)]
    cpu = Trainer(cpu_model, LearnerSection(lr=0.05, device="cpu", kl_coef=0.1, ema=0.5), clipped_ratio_loss)
    cuda = Trainer(cuda_model, LearnerSection(lr=0.05, device="cuda", kl_coef=0.1, ema=0.5), clipped_ratio_loss)
    assert next(cuda_model.parameters()).device.type == "cuda"
    for _ in range(3):
        on_cpu, cpu_stats = cpu.update(batch)
        on_cuda, cuda_stats = cuda.update(batch)
    assert all(t.device.type == "cpu" for t in on_cuda.values())
    torch.testing.assert_close(on_cuda, on_cpu, rtol=1e-4, atol=1e-5)
    assert abs(cuda_stats["learner/loss"] - cpu_stats["learner/loss"]) < 1e-4
    state = cuda.state_dict()
    assert all(t.device.type == "cpu" for t in _tensors(state))
    resumed = Trainer(BigramModel(seed=5), LearnerSection(lr=0.05, device="cuda", kl_coef=0.1, ema=0.5), clipped_ratio_loss)
    resumed.load_state_dict(state)  # a CPU checkpoint onto a CUDA learner
    a, _ = cuda.update(batch)
    b, _ = resumed.update(batch)
    torch.testing.assert_close(a, b)


@needs_cuda
def test_bf16_autocast_trains_on_cuda():
    model = BigramModel(seed=2)
    trainer = Trainer(model, LearnerSection(lr=0.05, device="cuda", bf16=True, max_items=0), clipped_ratio_loss)
    batch = [_group(model, g, [1.0, 0.0, 0.0, 1.0]) for g in range(3)]
    losses = [trainer.update(batch)[1]["learner/loss"] for _ in range(5)]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


@needs_cuda
def test_the_learner_stage_times_its_update_with_cuda_events():
    model = BigramModel(seed=3)
    trainer = Trainer(model, LearnerSection(lr=0.05, device="cuda"), clipped_ratio_loss)
    stage = LearnerStage(trainer, trainer.cfg, reports=None)
    profiler = Profiler(gpu_sample_hz=0.0, gpu_stages=["learner", "rollout"])
    with profiler.span("rollout", "env_step"):  # a CPU stage busy at the same time
        stage._update([_group(model, g, [1.0, 0.0]) for g in range(2)], 0, profiler)
    report = profiler.finish()
    learner = report.row("learner")
    assert learner.cuda_ms is not None and learner.cuda_ms > 0
    assert learner.gpu_from == RULE_CUDA and learner.gpu_pct > 0
    assert report.row("rollout").gpu_pct in (None, 0.0)  # no NVML here to share, and none of the events
