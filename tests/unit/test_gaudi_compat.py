"""What Gaudi users bring from the reference plugin: its documented variables,
``--device hpu``, Ray's HPU resources; and the vLLM hook points these rely on."""

import dataclasses
import inspect
import logging

import pytest
import torch
from models import model_path
from vllm.config import ParallelConfig

from vllm_hpu import envs
from vllm_hpu.bucketing.settings import base_strategy
from vllm_hpu.distributed import ray_cluster
from vllm_hpu.distributed.ray_cluster import check_hpu_resources
from vllm_hpu.patches import engine_args
from vllm_hpu.worker.compilation import layer_split
from vllm_hpu.worker.diagnostics.fallback_stats import StepFallbacks, new_fallbacks

BUCKET_DIMS = [
    ("PROMPT", "BS"),
    ("PROMPT", "SEQ"),
    ("DECODE", "BS"),
    ("DECODE", "BLOCK"),
]
# The reference Gaudi README's variables (HabanaAI/vllm-fork README_GAUDI.md and
# the newer reference's VLLM_CONTIGUOUS_PA / VLLM_BUCKETING_STRATEGY), set as users do.
REFERENCE_VARIABLES = {
    "VLLM_PROFILER_ENABLED": "true",
    "VLLM_HPU_LOG_STEP_GRAPH_COMPILATION": "true",
    "VLLM_HPU_LOG_STEP_GRAPH_COMPILATION_ALL": "true",
    "VLLM_HPU_LOG_STEP_CPU_FALLBACKS": "true",
    "VLLM_HPU_LOG_STEP_CPU_FALLBACKS_ALL": "true",
    "VLLM_T_COMPILE_FULLGRAPH": "true",
    "VLLM_T_COMPILE_DYNAMIC_SHAPES": "false",
    "VLLM_FULL_WARMUP": "false",
    "VLLM_SKIP_WARMUP": "true",
    "VLLM_GRAPH_RESERVED_MEM": "0.1",
    "VLLM_GRAPH_PROMPT_RATIO": "0.3",
    "VLLM_GRAPH_PROMPT_STRATEGY": "min_tokens",
    "VLLM_GRAPH_DECODE_STRATEGY": "max_bs",
    "VLLM_EXPONENTIAL_BUCKETING": "true",
    "VLLM_BUCKETING_STRATEGY": "exp",
    **{
        f"VLLM_{phase}_{dim}_BUCKET_{part}": "128"
        for phase, dim in BUCKET_DIMS
        for part in ("MIN", "STEP", "MAX")
    },
    "VLLM_HANDLE_TOPK_DUPLICATES": "true",
    "VLLM_CONFIG_HIDDEN_LAYERS": "2",
    "VLLM_DELAYED_SAMPLING": "true",
    "VLLM_PROMPT_USE_FUSEDSDPA": "1",
    "VLLM_PROMPT_USE_FLEX_ATTENTION": "false",
    "VLLM_DISABLE_MARK_SCALES_AS_CONST": "true",
    "VLLM_CONTIGUOUS_PA": "true",
    "VLLM_ENGINE_ITERATION_TIMEOUT_S": "600",
    "VLLM_RPC_TIMEOUT": "600000",
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1",
    "PT_HPU_LAZY_MODE": "0",
    "PT_HPU_ENABLE_LAZY_COLLECTIVES": "true",
    "PT_HPUGRAPH_DISABLE_TENSOR_CACHE": "1",
}
NO_EFFECT = [
    "VLLM_HANDLE_TOPK_DUPLICATES",
    "VLLM_PROMPT_USE_FLEX_ATTENTION",
    "VLLM_T_COMPILE_DYNAMIC_SHAPES",
    "VLLM_DISABLE_MARK_SCALES_AS_CONST",
    "VLLM_ENGINE_ITERATION_TIMEOUT_S",
    "VLLM_RPC_TIMEOUT",
    "VLLM_CONTIGUOUS_PA",
]


def test_reference_variables_are_all_recognised(monkeypatch, vllm_log):
    from vllm.platforms import current_platform

    for name, value in REFERENCE_VARIABLES.items():
        monkeypatch.setenv(name, value)
    current_platform.validate_environ(hard_fail=False)
    assert not [m for m in vllm_log.messages() if "Unknown vLLM environment" in m]
    parsed = envs.read_envs(REFERENCE_VARIABLES)
    assert parsed.config_hidden_layers == 2
    assert parsed.log_step_cpu_fallbacks_all is True


def test_no_effect_variables_are_named_once_with_why():
    notes = envs.no_effect_notes(envs.read_envs(REFERENCE_VARIABLES))
    assert [note.split(" ")[0] for note in notes] == NO_EFFECT
    assert all("is accepted but has no effect: " in note for note in notes)
    assert envs.no_effect_notes(envs.read_envs({})) == []


@pytest.mark.parametrize("name", ["VLLM_CONTIGUOUS_PA", "VLLM_DELAYED_SAMPLING"])
def test_no_effect_variable_malformed_value_is_an_error(name):
    with pytest.raises(ValueError, match=f"{name}='sometimes' is not valid"):
        envs.read_envs({name: "sometimes"})


@pytest.mark.parametrize(
    ("environ", "strategy"),
    [
        ({"VLLM_BUCKETING_STRATEGY": "exp"}, "exponential"),
        ({"VLLM_BUCKETING_STRATEGY": "lin"}, "linear"),
        (
            {"VLLM_BUCKETING_STRATEGY": "lin", "VLLM_EXPONENTIAL_BUCKETING": "0"},
            "linear",
        ),
        ({"VLLM_EXPONENTIAL_BUCKETING": "1"}, "exponential"),
        ({}, "compact"),
    ],
)
def test_bucketing_strategy_is_an_alias_of_exponential_bucketing(environ, strategy):
    assert base_strategy(envs.read_envs(environ)) == strategy


def test_bucketing_strategy_contradicting_exponential_bucketing_is_an_error():
    environ = {"VLLM_BUCKETING_STRATEGY": "exp", "VLLM_EXPONENTIAL_BUCKETING": "false"}
    with pytest.raises(ValueError, match="set only one of them"):
        envs.read_envs(environ)
    with pytest.raises(ValueError, match="accepts one of exp, lin"):
        envs.read_envs({"VLLM_BUCKETING_STRATEGY": "pad"})


@pytest.mark.parametrize("raw", ["0", "-1", "two"])
def test_config_hidden_layers_takes_a_positive_integer(raw):
    with pytest.raises(
        ValueError, match=r"VLLM_CONFIG_HIDDEN_LAYERS.*positive integer"
    ):
        envs.read_envs({"VLLM_CONFIG_HIDDEN_LAYERS": raw})


class _Stack(torch.nn.Module):
    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.ModuleList([torch.nn.Identity()])
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(4, 4) for _ in range(num_layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize(
    ("num_layers", "every", "marks_after"),
    [(6, 2, [1, 3, 5]), (5, 2, [1, 3]), (4, 1, [0, 1, 2, 3]), (3, 4, [])],
)
def test_config_hidden_layers_marks_a_step_every_n_layers(
    monkeypatch, num_layers, every, marks_after
):
    model = _Stack(num_layers)
    ran: list[int] = []
    for index, layer in enumerate(model.layers):
        layer.register_forward_hook(lambda *args, index=index: ran.append(index))
    marks: list[list[int]] = []
    monkeypatch.setattr(layer_split.device, "is_lazy", lambda: True)
    monkeypatch.setattr(layer_split.device, "mark_step", lambda: marks.append(ran[:]))
    assert layer_split.split_graph_every(model, every) == len(marks_after)
    model(torch.ones(1, 4))
    # Each mark closes the graph right after its layer ran, before the next one.
    assert [ranks[-1] for ranks in marks] == marks_after


def test_config_hidden_layers_needs_lazy_mode_and_the_variable(monkeypatch):
    monkeypatch.setattr(layer_split.device, "is_lazy", lambda: False)
    assert layer_split.split_graph_every(_Stack(4), 2) == 0
    monkeypatch.setattr(layer_split.device, "is_lazy", lambda: True)
    assert layer_split.split_graph_every(_Stack(4), None) == 0


def test_cpu_fallbacks_counted_per_step(monkeypatch, vllm_log):
    readings = iter([{"aten::a": 1}, {"aten::a": 1}, {"aten::a": 3, "aten::b": 1}])
    monkeypatch.setattr(
        "vllm_hpu.worker.diagnostics.fallback_stats.device.cpu_fallbacks",
        lambda: next(readings),
    )
    stats = StepFallbacks(log_nonzero=True, log_all=False)
    with stats.step():
        pass
    assert vllm_log.take() == ["Step 1: 3 CPU fallback(s) {'aten::a': 2, 'aten::b': 1}"]
    assert new_fallbacks({"x": 2}, {"x": 2, "y": 0}) == {}


def test_cpu_fallbacks_in_emulation_said_once(vllm_log):
    stats = StepFallbacks(log_nonzero=False, log_all=True)
    for _ in range(3):
        with stats.step():
            pass
    (message,) = vllm_log.messages()
    assert "every operator runs on the host" in message
    StepFallbacks(log_nonzero=False, log_all=False)
    assert len(vllm_log.messages()) == 1


def test_topk_duplicates_kept_by_vllms_sampler():
    """VLLM_HANDLE_TOPK_DUPLICATES asks that tokens tied with the k-th logit stay
    candidates; vLLM's top-k (which the runner uses) always keeps them."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    logits = torch.tensor([[4.0, 3.0, 3.0, 3.0, 1.0, 0.5]])
    kept = apply_top_k_top_p(logits.clone(), torch.tensor([2]), None)
    assert torch.isfinite(kept).tolist() == [[True, True, True, True, False, False]]


@pytest.mark.parametrize(
    ("value", "active", "message"),
    [
        ("hpu", False, "no Gaudi found .* set VLLM_HPU_EMULATION=1"),
        ("cpu", True, "--device cpu: vLLM runs on the HPU plugin here"),
        ("cuda", True, "--device cuda: vLLM runs on the HPU plugin here"),
        ("cuda", False, "--device cuda: vLLM has no --device option"),
    ],
)
def test_device_option_refused_with_its_fix(monkeypatch, value, active, message):
    monkeypatch.setattr("vllm_hpu.device.hpu_available", lambda: False)
    monkeypatch.setattr("vllm_hpu.device.is_emulation", lambda: active)
    with pytest.raises(ValueError, match=message):
        engine_args.check_device(value)


@pytest.mark.parametrize("value", [None, "auto", "hpu"])
def test_device_option_accepted_on_the_hpu_platform(value):
    engine_args.check_device(value)


def test_contract_engine_args_take_device_and_cli_has_the_option():
    """Pinned vLLM: EngineArgs has no ``device`` field (the patch adds a checked
    keyword) and ``vllm serve``'s parser gains ``--device``."""
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs
    from vllm.entrypoints.cli.serve import make_arg_parser  # 0.32 and 0.33
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    model = model_path("tiny-llama")
    assert "device" not in {f.name for f in dataclasses.fields(EngineArgs)}
    assert EngineArgs(model=model, device="hpu").model == model
    assert AsyncEngineArgs(model=model, device="hpu").model == model
    parser = make_arg_parser(FlexibleArgumentParser())
    assert "--device DEVICE" in parser.format_help()  # vllm serve --help=device
    assert parser.parse_args(["--device", "hpu"]).device == "hpu"
    with pytest.raises(SystemExit):
        parser.parse_args(["--device", "cpu"])
    # from_cli_args copies dataclass fields only, so --device never reaches it.
    args = parser.parse_args(["--device", "hpu", "--model", model])
    assert AsyncEngineArgs.from_cli_args(args).model == model


def test_contract_ray_hook_points():
    """Pinned vLLM: an Executor subclass may stand for ``ray``, and vLLM's Ray
    start-up skips ``ray.init`` when Ray is already initialised."""
    from vllm.v1.executor import ray_utils
    from vllm.v1.executor.abstract import Executor

    source = inspect.getsource(ray_utils.initialize_ray_cluster)
    assert "if ray.is_initialized():" in source
    assert "isinstance(distributed_executor_backend, type)" in inspect.getsource(
        Executor.get_class
    )


@pytest.mark.parametrize(
    ("resources", "needed", "fails"),
    [({"HPU": 2.0, "CPU": 2.0}, 2, False), ({"CPU": 4.0}, 2, True)],
)
def test_ray_hpu_resources_checked(resources, needed, fails):
    if not fails:
        check_hpu_resources(resources, needed)
        return
    with pytest.raises(RuntimeError) as error:
        check_hpu_resources(resources, needed)
    assert "offers 0 HPU resource(s); this engine needs 2" in str(error.value)
    assert """ray start --head --resources='{"HPU": 2}'""" in str(error.value)


class _FakeRay:
    """Ray as init_ray_with_hpus sees it: a cluster of CPUs only."""

    def __init__(self) -> None:
        self.initialized = False

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **kwargs: object) -> None:
        self.initialized = True

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": 2.0}

    def shutdown(self) -> None:
        self.initialized = False


def test_ray_started_for_a_refused_engine_is_shut_down(monkeypatch):
    fake = _FakeRay()
    monkeypatch.setattr(ray_cluster, "ray", fake)
    parallel_config = ParallelConfig(tensor_parallel_size=2)
    with pytest.raises(RuntimeError, match="offers 0 HPU"):
        ray_cluster.init_ray_with_hpus(parallel_config)
    assert not fake.initialized
    fake.initialized = True  # the caller's own Ray stays up
    with pytest.raises(RuntimeError, match="offers 0 HPU"):
        ray_cluster.init_ray_with_hpus(parallel_config)
    assert fake.initialized


def test_platform_names_each_no_effect_variable_at_start(monkeypatch, vllm_log):
    from vllm_hpu import platform

    monkeypatch.setattr(
        envs, "get_envs", lambda: envs.read_envs({"VLLM_CONTIGUOUS_PA": "1"})
    )
    platform._check_envs()
    notes = [m for m in vllm_log.messages(logging.INFO) if "VLLM_CONTIGUOUS_PA" in m]
    assert notes == [envs.no_effect_notes(envs.get_envs())[0]]
