"""--strategy fsdp on the one trainer (FSDP2 over gloo, 2 CPU processes) against ddp, its sharded last/ folder
resumed at another world size, and the plain model folder it ends as.

One torchrun launch runs every two-process command (tests/fixtures/torchrun_commands.py); the one-process runs
are in this process. Every run is deterministic (no augmentation, no drop path) with a flat learning rate, so
a run cut after epoch 0 and resumed at another world size with the same global batch must continue as the
uninterrupted run did, and ddp and fsdp must agree to float32 rounding.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file

import linvit
from linvit.classify import ClassifyConfig
from linvit.cli import main as cli_main
from linvit.data import build_cluttered_mnist
from linvit.engine import sharded_checkpoint, sharding
from linvit.errors import UsageError

RUNNER = Path(__file__).parent / "fixtures" / "torchrun_commands.py"
BATCH = 5  # per process at world 2; 10 at world 1
EPOCHS = 2
STILL = ["--aa", "none", "--mixup", "0", "--cutmix", "0", "--reprob", "0", "--smoothing", "0", "--drop-path", "0"]
STILL += ["--hflip", "0", "--scale", "1", "1", "--ratio", "1", "1", "--color-jitter", "0", "--crop-pct", "1.0"]
MODEL = ["--model", "infvit_tiny_patch16_224", "--model-kwargs", "patch_size=8", "depth=2", "embed_dim=32"]
MODEL += ["num_heads=2"]


def train(data, out, *, strategy="fsdp", epochs=EPOCHS, batch=BATCH, extra=()) -> list[str]:
    """A flat learning rate (min = max, no warm-up): a resume that changes --epochs keeps every step's lr."""
    args = ["train", "--data", str(data), *MODEL, "--output", str(out), "--epochs", str(epochs)]
    args += ["--batch-size", str(batch), "--lr", "1e-3", "--min-lr", "1e-3", "--warmup-epochs", "0", "--img-size"]
    args += ["32", *STILL, "--model-ema", "--model-ema-decay", "0.9"]  # the folder's weights: the sharded EMA's
    return [*args, "--workers", "0", "--no-progress", "--device", "cpu", "--strategy", strategy, *extra]


def distill(data, out, strategy: str) -> list[str]:
    """Both stages from a random 2-block ViT teacher; under fsdp the teacher is sharded too. Attention transfer on
    Hedgehog's weight loss alone (it read the projections after the forward, sharded again by then, and its loss
    never reached the layers' outputs, where fsdp gathers them for backward); the end-to-end stage checkpointed,
    through LoRA adapters (merged into the plain student the folder holds)."""
    args = ["distill", "--teacher", "vit_4l_patch16_224", "--model-kwargs", "patch_size=8", "embed_dim=32", "depth=2"]
    args += ["num_heads=2", "num_classes=10", "--data", str(data), "--img-size", "32", "--epochs", "1"]
    args += ["--batch-size", "4", "--workers", "0", "--device", "cpu", "--no-progress", "--output", str(out)]
    args += ["--transfer-loss", "xent", "--grad-checkpointing"]
    args += ["--lora-rank", "2"] if importlib.util.find_spec("peft") else []  # the distill extra (not in `.[dev]`)
    return [*args, "--strategy", strategy]  # --mixer auto: linear_attention:hedgehog (learned maps)


def distill_language(root: Path, out, strategy: str) -> list[str]:
    """Attention transfer alone (auto's window and stages) from a 1-block random GPT-2 into causal Katz-InfSA with
    learned maps (auto's form): the loss reads each converted layer's output, not its block's."""
    args = ["distill", "--teacher", f"hf:{root / 'gpt2'}", "--data", str(root / "text.txt"), "--context", "80"]
    args += ["--train-windows", "8", "--batch-size", "2", "--workers", "0", "--device", "cpu", "--no-progress"]
    return [*args, "--output", str(out), "--strategy", strategy]


def language_teacher(root: Path) -> bool:
    """A tiny GPT-2 and its text under root, where transformers is installed."""
    try:
        import transformers
    except ImportError:
        return False
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions=160, n_embd=32, n_layer=1, n_head=4)
    config.bos_token_id = config.eos_token_id = 0
    transformers.GPT2LMHeadModel(config).save_pretrained(root / "gpt2")
    (root / "text.txt").write_text("the quick brown fox jumps over the lazy dog. " * 120, encoding="utf-8")
    return True


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def weights(out: Path) -> dict:
    return load_file(str(out / "model.safetensors"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """ddp and fsdp at world 2 for EPOCHS; fsdp cut after epoch 0 at world 2 and resumed at world 1; fsdp cut
    after epoch 0 at world 1 and resumed at world 2."""
    root = tmp_path_factory.mktemp("fsdp")
    data = root / "data"
    build_cluttered_mnist(data, canvas=32, per_class_train=4, per_class_val=2, clutter=1, progress=False)
    names = ("ddp", "fsdp", "hsdp", "two_to_one", "one_to_two", "distill_ddp", "distill_fsdp", "lm_ddp", "lm_fsdp")
    out = {name: root / name for name in names}
    assert cli_main(train(data, out["one_to_two"], epochs=1, batch=2 * BATCH)) == 0
    commands = [
        train(data, out["ddp"], strategy="ddp"),
        train(data, out["fsdp"]),
        # a replicate x shard mesh (2 groups of 1), each block recomputed in backward
        train(data, out["hsdp"], extra=["--shard-size", "1", "--grad-checkpointing"]),
        train(data, out["two_to_one"], epochs=1),
        train(data, out["one_to_two"], extra=["--resume", "auto"]),
        distill(data, out["distill_ddp"], "ddp"),
        distill(data, out["distill_fsdp"], "fsdp"),
    ]
    if language_teacher(root):
        commands += [distill_language(root, out["lm_ddp"], "ddp"), distill_language(root, out["lm_fsdp"], "fsdp")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(RUNNER)]
    result = subprocess.run([*launch, json.dumps(commands)], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert cli_main(train(data, out["two_to_one"], batch=2 * BATCH, extra=["--resume", "auto"])) == 0
    return data, out, result.stdout


def assert_same_weights(a: Path, b: Path, atol: float = 1e-5) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=1e-4, atol=atol, msg=key)


@pytest.mark.parametrize("name", ["fsdp", "hsdp"])
def test_fsdp_follows_ddp_step_for_step(runs, name):
    _, out, _ = runs
    ddp, fsdp = metrics(out["ddp"]), metrics(out[name])
    assert len(ddp) == len(fsdp) == EPOCHS
    for a, b in zip(ddp, fsdp, strict=True):
        for key in ("train_loss", "grad_norm", "grad_norm_max", "val_loss", "val_top1_ema"):
            assert b[key] == pytest.approx(a[key], rel=1e-5), (a["epoch"], key)
    assert ddp[-1]["train_loss"] < ddp[0]["train_loss"]  # it trained: the agreement is not two stuck runs
    assert_same_weights(out["ddp"], out[name])
    assert (out[name] / "last" / ".metadata").is_file() and not (out[name] / "last.pth").exists()
    assert (out["ddp"] / "last.pth").is_file()


def test_fsdp_keeps_about_half_the_training_state_per_rank(runs):
    """Parameters, gradients and AdamW's moments per rank, as each run recorded them: ddp's are the same whole
    state on both ranks; fsdp's two shards add up to it (dim-0 shards: rank 0 holds any odd row)."""
    _, out, _ = runs
    ddp, fsdp = (json.loads((out[r] / "config.json").read_text())["linvit"] for r in ("ddp", "fsdp"))
    ddp, fsdp = ddp["state_bytes_per_rank"], fsdp["state_bytes_per_rank"]
    assert ddp[0] == ddp[1] and sum(fsdp) == ddp[0]
    assert max(fsdp) < 0.6 * ddp[0]


def test_grad_checkpointing_needs_a_model_that_has_it():
    with pytest.raises(UsageError, match="Linear has no set_grad_checkpointing"):
        sharding.set_grad_checkpointing(torch.nn.Linear(2, 2))
    model = timm.create_model("infvit_tiny_patch16_224", depth=1, embed_dim=32, num_heads=2, img_size=32)
    distiller = torch.nn.Module()
    distiller.student = model
    sharding.set_grad_checkpointing(distiller)  # the outermost module that has it: the student inside
    assert model.grad_checkpointing


def test_the_blocks_are_sharded_one_by_one():
    model = torch.nn.Module()
    model.blocks = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model.stages = torch.nn.ModuleList([torch.nn.Module()])
    model.stages[0].blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    assert sharding.blocks(model) == [*model.blocks, model.stages[0].blocks[0]]


def test_marked_units_are_sharded_once_and_after_the_modules_inside_them():
    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(2, 2)), torch.nn.Linear(2, 2)])
    model.neck = torch.nn.Sequential(torch.nn.Linear(2, 2))
    inner = model.blocks[0][0]
    for unit in (inner, model.blocks[1], model.neck):  # inside a block, a block itself, one holding no block
        sharding.mark_unit(unit)
    found = sharding.blocks(model)
    assert len(found) == len({id(m) for m in found}) == 4
    assert found.index(model.blocks[0]) < found.index(inner)  # shard() wraps in reverse: the inner one first
    assert set(map(id, found)) == set(map(id, [*model.blocks, inner, model.neck]))


@pytest.mark.parametrize("name", ["two_to_one", "one_to_two"])
def test_a_resume_at_another_world_size_continues_the_run(runs, name):
    _, out, stdout = runs
    ddp, resumed = metrics(out["ddp"]), metrics(out[name])
    assert [r["epoch"] for r in resumed] == list(range(EPOCHS))
    for a, b in zip(ddp, resumed, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4), (name, a["epoch"])
    assert_same_weights(out["ddp"], out[name], atol=1e-4)
    if name == "one_to_two":
        assert "world size 1 -> 2: global batch 10 kept (10 -> 5 per process)" in stdout


def test_the_run_folder_loads_as_one_plain_model(runs):
    data, out, _ = runs
    model = linvit.load_run(out["fsdp"])
    reference = linvit.load_run(out["ddp"])
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), rtol=1e-4, atol=1e-5)
    report = out["fsdp"] / "eval.json"
    args = ["eval", "--checkpoint", str(out["fsdp"]), "--data", str(data), "--workers", "0", "--device", "cpu"]
    assert cli_main([*args, "--no-progress", "--json", str(report)]) == 0
    sharded = metrics(out["fsdp"])[-1]  # what the sharded EMA scored in the run (gathered for evaluation)
    scored = json.loads(report.read_text())
    assert (scored["top1"], scored["top5"]) == (sharded["val_top1_ema"], sharded["val_top5_ema"])


def test_a_sharded_checkpoint_of_another_model_is_one_line(runs, tmp_path, capsys):
    data, out, _ = runs
    other = [a if a != "depth=2" else "depth=1" for a in train(data, tmp_path / "other")]
    assert cli_main([*other, "--resume", str(out["fsdp"] / "last")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot resume" in err and "--model-kwargs" in err
    kwargs = dict(patch_size=8, depth=2, embed_dim=48, num_heads=2, img_size=32, num_classes=10)
    model = timm.create_model("infvit_tiny_patch16_224", **kwargs)  # other tensors: DCP's own error, in one line
    run = type("Run", (), {"model": model, "optimizer": torch.optim.AdamW(model.parameters()), "ema": None})
    with pytest.raises(UsageError, match="do not fit this model") as err:
        sharded_checkpoint.load(run, out["fsdp"] / "last")
    assert "\n" not in str(err.value)


def test_a_damaged_sharded_checkpoint_is_one_line(runs, tmp_path, capsys):
    data, out, _ = runs
    broken = tmp_path / "run"
    broken.mkdir()
    (broken / "last").mkdir()
    (broken / "last" / ".metadata").write_bytes(b"not a checkpoint")
    assert cli_main([*train(data, broken), "--resume", "auto"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a whole linvit sharded checkpoint" in err


def test_what_fsdp_does_not_take_is_one_line():
    with pytest.raises(UsageError, match="bf16 or none"):
        sharding.check_strategy(ClassifyConfig(strategy="fsdp", amp="fp16"))
    with pytest.raises(UsageError, match="add --strategy fsdp"):
        sharding.check_strategy(ClassifyConfig(shard_size=2))
    with pytest.raises(UsageError, match="must divide the world size 2"):
        sharding.device_mesh(2, torch.device("cpu"), 3)


def test_a_sharded_teacher_distills_the_same_student(runs):
    _, out, _ = runs
    for stage in ("attention", "."):
        ddp, fsdp = metrics(out["distill_ddp"] / stage), metrics(out["distill_fsdp"] / stage)
        for a, b in zip(ddp, fsdp, strict=True):
            for key in ("train_loss", "val_loss", "teacher_val_loss"):
                assert b[key] == pytest.approx(a[key], rel=1e-5), (stage, a["epoch"], key)
        assert_same_weights(out["distill_ddp"] / stage, out["distill_fsdp"] / stage)


def test_a_sharded_language_student_learns_its_maps_as_ddps_does(runs):
    """Attention transfer of a language student under fsdp (each converted layer sharded as a unit of its own,
    sharding.mark_unit): before, its backward met resharded parameters ("setStorage ... out of bounds")."""
    _, out, _ = runs
    if not out["lm_ddp"].exists():
        pytest.skip("transformers is not installed")
    ddp, fsdp = metrics(out["lm_ddp"]), metrics(out["lm_fsdp"])
    assert len(ddp) == len(fsdp) >= 1
    for a, b in zip(ddp, fsdp, strict=True):
        for key in ("train_loss", "val_loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-5), (a["epoch"], key)
    assert_same_weights(out["lm_ddp"], out["lm_fsdp"])
    assert any("feature_q" in k for k in weights(out["lm_fsdp"]))  # the learned maps trained and were saved


def test_a_kill_between_the_sharded_saves_renames_resumes_from_last_old(tmp_path):
    """The swap renames last/ to last.old/, then last.tmp/ to last/: a kill between them leaves the previous
    checkpoint as last.old/ only, and --resume auto must read it rather than restart (and then delete it)."""
    from linvit.engine.resume import find_resume

    old = fake_checkpoint(tmp_path / "last.old", 3)
    assert find_resume(tmp_path, "auto", True) == old and find_resume(tmp_path, "auto", False) == old
    fake_checkpoint(tmp_path / "last", 4)
    (old / "linvit.pth").unlink()  # a kill while last.old/ was being removed: never read beside a whole last/
    assert find_resume(tmp_path, "auto", True) == tmp_path / "last"


def fake_checkpoint(path: Path, epoch: int) -> Path:
    """What --resume auto reads to choose: a last.pth, or a sharded folder's .metadata and linvit.pth."""
    state = {"model": {}, "optimizer": {}, "scheduler": {}, "epoch": epoch, "rng": [], "args": {}}
    if path.suffix == ".pth":
        torch.save(state, path)
        return path
    path.mkdir()
    (path / ".metadata").write_bytes(b"")
    torch.save(state, path / sharded_checkpoint.EXTRA)
    return path


def test_resume_auto_takes_the_newer_checkpoint_of_either_kind(tmp_path):
    """A run that changed --strategy leaves the other kind's older checkpoint beside its own: the newer by epoch
    is resumed whichever strategy asks (its own kind on a tie), never the older one."""
    from linvit.engine.resume import find_resume

    ddp, fsdp = fake_checkpoint(tmp_path / "last.pth", 4), fake_checkpoint(tmp_path / "last", 2)
    assert find_resume(tmp_path, "auto", True) == ddp and find_resume(tmp_path, "auto", False) == ddp
    torch.save({**torch.load(ddp, weights_only=True), "epoch": 2}, ddp)
    assert find_resume(tmp_path, "auto", True) == fsdp and find_resume(tmp_path, "auto", False) == ddp
    torch.save({**torch.load(ddp, weights_only=True), "epoch": 1}, ddp)
    assert find_resume(tmp_path, "auto", True) == fsdp and find_resume(tmp_path, "auto", False) == fsdp


def test_a_resume_under_the_other_strategy_says_so_and_takes_the_newer_checkpoint(tmp_path, capsys):
    """One process: ddp writes last.pth (epoch 0), fsdp resumes from it and writes last/ (epoch 1), ddp resumes
    from last/ (the newer), not from the older last.pth beside it; each switch is one line."""
    data = tmp_path / "data"
    build_cluttered_mnist(data, canvas=32, per_class_train=1, per_class_val=1, clutter=1, progress=False)
    out = tmp_path / "run"
    assert cli_main(train(data, out, strategy="ddp", epochs=1, batch=2 * BATCH)) == 0
    capsys.readouterr()
    assert cli_main(train(data, out, strategy="fsdp", epochs=2, batch=2 * BATCH, extra=["--resume", "auto"])) == 0
    said = capsys.readouterr().out
    assert f"resumed from {out / 'last.pth'} at epoch 1" in said
    assert "strategy ddp -> fsdp: checkpoints from now on are last/" in said
    assert cli_main(train(data, out, strategy="ddp", epochs=3, batch=2 * BATCH, extra=["--resume", "auto"])) == 0
    said = capsys.readouterr().out
    assert f"resumed from {out / 'last'} at epoch 2" in said
    assert "strategy fsdp -> ddp: checkpoints from now on are last.pth" in said
    assert [r["epoch"] for r in metrics(out)] == [0, 1, 2]


AGREE = """
import os, sys, torch.distributed as dist
from pathlib import Path
dist.init_process_group("gloo")
rank = dist.get_rank()
from linvit.distributed import on_every_rank
from linvit.engine import resume
from linvit.errors import UsageError
if rank == 1:  # this rank's view of the shared folder differs: it sees no checkpoint there
    resume.find_resume = lambda *args: None
path, epoch, is_sharded = resume.agreed_checkpoint(Path(sys.argv[1]), "auto", "ddp")
print("chose", path.name, epoch, is_sharded)
if rank == 1:  # ... and reads another epoch from the one rank 0 chose
    real = resume.read_checkpoint
    resume.read_checkpoint = lambda *args, **kwargs: {**real(*args, **kwargs), "epoch": 0}
try:
    on_every_rank(lambda: resume.read_agreed(path, epoch, is_sharded, rank))
except UsageError as err:
    print("refused:", err)
dist.barrier()  # both ranks done before either tears down (rank 0 hosts the store; its early exit crashed rank 1 once)
sys.stdout.flush()
os._exit(0)  # no gloo teardown: destroy_process_group aborted once under load ("terminate called without an active
# exception", exit -6) after everything this test checks had been printed
"""


def test_every_rank_resumes_the_checkpoint_rank_0_chose(tmp_path):
    """Two gloo processes whose views of the folder differ: rank 1 sees no checkpoint, yet resumes the one rank 0
    chose (the newer: last/ at epoch 1 over last.pth at epoch 0); reading another epoch there stops both ranks
    with the same line, not one rank alone (the other would wait in the next collective for good)."""
    fake_checkpoint(tmp_path / "last.pth", 0)
    fake_checkpoint(tmp_path / "last", 1)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29900 + os.getpid() % 90)}
    env |= {"WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", AGREE, str(tmp_path)],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    assert all(rank.returncode == 0 for rank in ranks), [err[-2000:] for _, err in outputs]
    said = [[line for line in out.splitlines() if line.startswith(("chose", "refused"))] for out, _ in outputs]
    assert said[0] == said[1], said
    assert said[0][0] == "chose last 1 True"
    assert said[0][1].startswith("refused: cannot resume from") and "rank 1 reads epoch 1's" in said[0][1]


FROZEN_ROOT = """
import os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"], RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
from torch.distributed.device_mesh import init_device_mesh
from linvit.engine import sharding
teacher = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.Linear(4, 4))).requires_grad_(False)
sharding.shard(teacher, init_device_mesh("cpu", (1,)), frozen=True)
unsharded = lambda: teacher._get_fsdp_state()._fsdp_param_group.is_unsharded
x = torch.randn(2, 4)
with torch.no_grad():
    teacher(x)
    before = unsharded()
    with sharding.gathered(None, frozen=[teacher]):
        teacher(x)
    teacher(x)
    print("unsharded after forward:", before, unsharded())
dist.destroy_process_group()
"""


def test_a_frozen_teachers_root_releases_its_parameters_after_forward_again_after_evaluation():
    """gathered() keeps every module's parameters for evaluation; after it a frozen teacher's root must go back to
    releasing them after forward (shard(frozen=True)), or its embeddings stay whole on every rank."""
    port = str(29700 + os.getpid() % 200)
    result = subprocess.run(
        [sys.executable, "-c", FROZEN_ROOT],
        env={**os.environ, "PORT": port, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("unsharded after forward:"))
    assert line.split()[-2:] == ["False", "False"]


def test_the_streamed_safetensors_file_reads_back_as_safetensors_writes_it(tmp_path):
    """write_safetensors (one tensor at a time) against safetensors' own save_file: the same tensors, names, dtypes
    and shapes, tied and strided tensors included, aligned for every dtype."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from linvit.utils.artifacts import layout_of, write_safetensors

    g = torch.Generator().manual_seed(0)
    tied = torch.randn(5, 3, generator=g, dtype=torch.float64)
    state = {"embed.weight": tied, "head.weight": tied, "strided": torch.randn(4, 6, generator=g).t()}
    state |= {"half": torch.randn(3, generator=g).half(), "bf16": torch.randn(1, 3, generator=g).bfloat16()}
    state |= {"steps": torch.tensor(7), "mask": torch.tensor([True, False, True]), "empty": torch.zeros(0, 2)}
    fetched = []
    write_safetensors(tmp_path / "streamed.safetensors", layout_of(state), lambda k: fetched.append(k) or state[k])
    assert sorted(fetched) == sorted(state) and not (tmp_path / "streamed.safetensors.tmp").exists()
    save_file({k: v.contiguous().clone() for k, v in state.items()}, str(tmp_path / "reference.safetensors"))
    streamed, reference = (load_file(str(tmp_path / f"{n}.safetensors")) for n in ("streamed", "reference"))
    assert streamed.keys() == reference.keys() == state.keys()
    for key, value in reference.items():
        assert streamed[key].dtype == value.dtype and torch.equal(streamed[key], value), key
    with safe_open(str(tmp_path / "streamed.safetensors"), "pt") as f:
        assert set(f.keys()) == set(state)
    write_safetensors(None, layout_of(state), lambda k: fetched.append(k) or state[k])  # a helping rank: no file
    assert fetched[len(state) :] == fetched[: len(state)]  # the same order on every rank


def memory_script():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "fsdp_memory.py"
    spec = importlib.util.spec_from_file_location("fsdp_memory", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_memory_benchmark_measures_a_converted_language_model(tmp_path):
    """scripts/fsdp_memory.py's language rows at a tiny Llama shape (the 1B row's code path): ddp on one process
    holds 16 bytes a parameter (weights, gradients, AdamW's two moments), fsdp's two ranks half of it each."""
    pytest.importorskip("transformers")
    pytest.importorskip("psutil")
    row = memory_script().measure_row("llama_tiny", tmp_path)
    ddp, fsdp = row["ddp"]["state_bytes_per_rank"], row["fsdp"]["state_bytes_per_rank"]
    assert row["ddp"]["processes"] == 1 and ddp == [16 * row["parameters"]]
    assert len(fsdp) == 2 and sum(fsdp) == ddp[0] and max(fsdp) < 0.6 * ddp[0]
    assert row["fsdp_over_ddp"] == max(fsdp) / ddp[0] and row["fsdp"]["peak_rss_bytes"] > 0


def test_the_committed_memory_table_is_generated_from_the_committed_json():
    script, root = memory_script(), Path(__file__).resolve().parents[1]
    record = json.loads((root / "docs" / "bench" / "fsdp_memory.json").read_text())
    assert script.table(record) in (root / "docs" / "benchmarks.md").read_text()


def test_a_session_settles_before_leaving_only_when_its_work_finished(monkeypatch):
    """distributed_session's barrier (settle: gloo's threads let go of their last tensors before the interpreter
    ends) runs after a finished session only: a rank that failed never reaches it, so the others would wait there
    for ever."""
    import linvit.distributed as distributed

    settled = []
    monkeypatch.setattr(distributed, "settle", lambda: settled.append(True))
    with distributed.distributed_session("cpu"):
        pass
    assert settled == [True]
    with pytest.raises(RuntimeError, match="this rank failed"):
        with distributed.distributed_session("cpu"):
            raise RuntimeError("this rank failed")
    assert settled == [True]

    def peer_gone():
        raise RuntimeError("Connection closed by peer")

    left = []
    monkeypatch.setattr(distributed, "settle", peer_gone)  # a peer failed after its last collective
    monkeypatch.setattr(distributed, "cleanup", lambda: left.append(True))
    with distributed.distributed_session("cpu"):
        pass  # this rank finished: it leaves the group and ends well
    assert left == [True]


def test_segmentation_and_generation_train_under_fsdp_as_under_ddp(tmp_path):
    """--strategy fsdp on the segmenter and (with diffusers) the DiT: the same losses as ddp, and no FSDP2 warning
    about the models' outputs being views (their consumers, the losses and timm's residual adds, are out of
    place: sharding.shard silences it)."""
    data = tmp_path / "data"
    build_cluttered_mnist(data, canvas=32, per_class_train=2, per_class_val=1, clutter=2, progress=False)
    runtime = ["--workers", "0", "--device", "cpu", "--no-progress", "--epochs", "2"]

    def segment(strategy: str) -> list[str]:
        args = ["segment", "train", "--data", str(data), "--model", "deit_tiny_patch16_224", "--batch-size", "2"]
        args += ["--crop-size", "32", "--scale", "1", "1", "--model-kwargs", "patch_size=8", "depth=2"]
        return [*args, *runtime, "--output", str(tmp_path / f"segment_{strategy}"), "--strategy", strategy]

    def generate(strategy: str) -> list[str]:
        args = ["generate", "train", "--data", "digits:digit,canvas=32,clutter=0,length=96", "--mixer", "katz_infsa"]
        args += ["--batch-size", "16", "--val-images", "32"]
        return [*args, *runtime, "--output", str(tmp_path / f"generate_{strategy}"), "--strategy", strategy]

    tasks = {"segment": segment}
    try:
        import diffusers  # noqa: F401
    except ImportError:
        pass
    else:
        tasks["generate"] = generate
    commands = [build(strategy) for build in tasks.values() for strategy in ("ddp", "fsdp")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(RUNNER)]
    result = subprocess.run([*launch, json.dumps(commands)], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "returned a view tensor" not in result.stderr
    for task in tasks:
        ddp, fsdp = metrics(tmp_path / f"{task}_ddp"), metrics(tmp_path / f"{task}_fsdp")
        assert [r["train_loss"] for r in fsdp] == pytest.approx([r["train_loss"] for r in ddp], rel=1e-5), task


def test_fsdp_view_warning_is_quiet_inside_the_trainers_run_only():
    import warnings

    message = "FSDP2-wrapped module (FSDPLinear) returned a view tensor. An in-place op on this view ..."
    with sharding.quiet_view_warnings():
        with warnings.catch_warnings(record=True) as seen:  # the filters in force stay
            warnings.warn(message, UserWarning, stacklevel=1)
    assert not seen
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.warn(message, UserWarning, stacklevel=1)
    assert len(seen) == 1  # after the run a user's own FSDP code still hears it
