"""`linvit generate`: DDPM training on the drawn digits resumes exactly after SIGKILL; sampling writes a grid of
the asked classes; diffusers' schedule is what the loss and the sampler use."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")

from linvit.cli import main as cli_main  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
DATA = "digits:digit,canvas=32,clutter=0,length=96"


def _train_cmd(out, mixer: str = "weightformer", epochs: int = 3) -> list[str]:
    return [
        *(sys.executable, "-m", "linvit", "generate", "train", "--data", DATA, "--output", str(out)),
        *("--mixer", mixer, "--epochs", str(epochs), "--batch-size", "32", "--workers", "0", "--val-images", "64"),
        *("--no-progress", "--threads", "1"),
    ]


def _metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_training_resumes_after_sigkill_exactly(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(_train_cmd(full), check=True, env=ENV, capture_output=True)
    proc = subprocess.Popen(_train_cmd(killed), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not ((killed / "metrics.jsonl").exists() and (killed / "metrics.jsonl").read_text().count("\n") >= 1):
        assert proc.poll() is None and time.time() < deadline, "training ended before it could be killed"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 1 <= len(_metrics(killed)) < 3
    subprocess.run([*_train_cmd(killed), "--resume", "auto"], check=True, env=ENV, capture_output=True)
    a, b = (torch.load(run / "last.pth", weights_only=True) for run in (full, killed))
    for part in ("model", "ema"):
        for key, value in a[part].items():
            assert torch.equal(value, b[part][key]), (part, key)
    assert [r["train_loss"] for r in _metrics(killed)] == [r["train_loss"] for r in _metrics(full)]
    assert [r["val_loss"] for r in _metrics(killed)] == [r["val_loss"] for r in _metrics(full)]
    info = json.loads((full / "config.json").read_text())["linvit"]
    assert (info["task"], info["mixer"], info["weights"], info["channels"], info["image_size"]) == (
        "generation",
        "weightformer",
        "ema",
        1,
        32,
    )


@pytest.mark.parametrize("mixer", ["softmax", "linear_infsa"])
def test_sample_writes_a_grid_of_the_asked_classes(tmp_path, mixer):
    run = tmp_path / "run"
    assert (
        cli_main(
            [
                "generate",
                "train",
                "--data",
                DATA,
                "--output",
                str(run),
                "--mixer",
                mixer,
                "--epochs",
                "1",
                "--batch-size",
                "32",
                "--workers",
                "0",
                "--val-images",
                "32",
                "--no-progress",
            ]
        )
        == 0
    )
    out = tmp_path / "grid.png"
    argv = ["generate", "sample", "--checkpoint", str(run), "--classes", "3,7", "--num", "4", "--steps", "4"]
    assert cli_main([*argv, "--output", str(out), "--no-progress"]) == 0
    saved = np.load(out.with_suffix(".npz"))
    assert saved["images"].shape == (4, 1, 32, 32) and saved["labels"].tolist() == [3, 7, 3, 7]
    assert 0 <= saved["images"].min() and saved["images"].max() <= 1
    import linvit

    model = linvit.load_run(run)  # a generation run reloads in Python like any other run folder
    assert type(model).__name__ == "DiT" and model.mixer == mixer and model.label_names == [str(d) for d in range(10)]
    again = tmp_path / "again.png"
    assert cli_main([*argv, "--output", str(again), "--no-progress"]) == 0
    assert np.array_equal(np.load(again.with_suffix(".npz"))["images"], saved["images"])  # seeded
    assert cli_main([*argv[:-4], "--classes", "12", "--output", str(again)]) == 2  # the run has 10 classes
    assert cli_main(["generate", "sample", "--checkpoint", str(tmp_path), "--output", str(again)]) == 2


def test_the_loss_noises_with_diffusers_schedule():
    from linvit.generate.diffusion import ddpm_loss, noise_schedule

    schedule = noise_schedule()
    x0 = torch.randn(4, 1, 8, 8)
    seen = {}

    def model(noisy, t, labels):  # a perfect noise predictor: recovers eps from x_t and x0
        a = schedule.alphas_cumprod[t].view(-1, 1, 1, 1)
        seen["t"] = t
        return (noisy - a.sqrt() * x0) / (1 - a).sqrt()

    loss = ddpm_loss(model, x0, torch.zeros(4, dtype=torch.long), schedule, torch.Generator().manual_seed(0))
    assert float(loss) < 1e-8 and seen["t"].min() >= 0 and seen["t"].max() < 1000

    v_schedule = noise_schedule("v_prediction")

    def v_model(noisy, t, labels):  # a perfect v predictor: v = sqrt(a) eps - sqrt(1 - a) x0 (Salimans & Ho)
        a = v_schedule.alphas_cumprod[t].view(-1, 1, 1, 1)
        eps = (noisy - a.sqrt() * x0) / (1 - a).sqrt()
        return a.sqrt() * eps - (1 - a).sqrt() * x0

    labels = torch.zeros(4, dtype=torch.long)
    assert float(ddpm_loss(v_model, x0, labels, v_schedule, torch.Generator().manual_seed(0))) < 1e-8
    assert float(ddpm_loss(model, x0, labels, v_schedule, torch.Generator().manual_seed(0))) > 0.1  # eps is not v


def test_frechet_distance_matches_the_closed_form():
    from linvit.generate.score import frechet_distance

    rng = np.random.default_rng(0)
    a = rng.normal(size=(4000, 3))
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-9)
    shifted = a + np.array([1.0, 2.0, 0.0])
    assert frechet_distance(a, shifted) == pytest.approx(5.0, rel=1e-9)  # same covariance: ||mu_a - mu_b||^2
    scaled = a * 2.0  # means m and 2m, covariances S and 4S: ||m||^2 + Tr(S + 4S - 2 * 2S) = ||m||^2 + Tr(S)
    expected = (a.mean(0) ** 2).sum() + np.trace(np.cov(a, rowvar=False))
    assert frechet_distance(a, scaled) == pytest.approx(expected, rel=1e-9)


def test_score_judges_samples_with_a_linvit_classifier(tmp_path):
    gen_run, cls_run = tmp_path / "gen", tmp_path / "cls"
    assert (
        cli_main(
            [
                "generate",
                "train",
                "--data",
                DATA,
                "--output",
                str(gen_run),
                "--mixer",
                "katz_infsa",
                "--epochs",
                "1",
                "--batch-size",
                "32",
                "--workers",
                "0",
                "--val-images",
                "32",
                "--no-progress",
            ]
        )
        == 0
    )
    train = ["train", "--data", DATA, "--model", "vit_4l_patch16_224", "--img-size", "32", "--crop-pct", "1"]
    train += ["--model-kwargs", "patch_size=8", "embed_dim=32", "num_heads=2", "--epochs", "1", "--batch-size", "32"]
    train += ["--workers", "0", "--aa", "none", "--mixup", "0", "--cutmix", "0", "--reprob", "0", "--hflip", "0"]
    assert cli_main([*train, "--no-progress", "--output", str(cls_run)]) == 0
    out = tmp_path / "score.json"
    argv = ["generate", "score", "--checkpoint", str(gen_run), "--classifier", str(cls_run), "--num", "20"]
    assert cli_main([*argv, "--steps", "3", "--json", str(out), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert 0 <= result["class_accuracy"] <= 1 and result["frechet_distance"] >= 0
    assert (result["samples"], result["real_images"], result["mixer"]) == (20, 20, "katz_infsa")
    assert 0 <= result["real_class_accuracy"] <= 1 and (20 * result["real_class_accuracy"]).is_integer()
    assert result["real_frechet_distance"] >= 0 and result["sampling_seconds"] > 0
    argv[5] = str(gen_run)  # a generator is not a classifier
    assert cli_main([*argv, "--steps", "3", "--no-progress"]) == 2


def test_bench_generate_times_a_guided_sampling_step_and_a_training_step():
    """--task generate: the mixers are the models, --res the latent side; a softmax DiT's FLOPs grow faster than
    the tokens (attention is quadratic), a Linear-InfSA DiT's no faster (its mixing is linear)."""
    from linvit.bench.point import measure

    spec = dict(task="generate", iters=1, warmup=1, model_kwargs={"size": "tiny"})
    gflops = {}
    for mixer in ("softmax", "linear_infsa"):
        small, large = (measure({**spec, "model": mixer, "res": res}) for res in (16, 32))
        assert (small["tokens"], large["tokens"]) == (64, 256)  # DiT's patch 2
        gflops[mixer] = large["gflops"] / small["gflops"]
    assert gflops["softmax"] > 4.5 and gflops["linear_infsa"] < 4.05, gflops
    train = measure({**spec, "model": "weightformer", "res": 16, "mode": "train", "batch": 2})
    assert train["status"] == "ok" and train["gflops"] > 0 and train["params"] > 0


def test_bench_generate_names_the_mixers_it_takes(tmp_path, capsys):
    argv = ["bench", "--task", "generate", "--models", "vit_4l_patch16_224", "--res", "16", "--output", str(tmp_path)]
    assert cli_main(argv) == 2
    from linvit.models.dit import dit_mixers

    assert dit_mixers()[:4] == ("softmax", "pure_infsa", "linear_infsa", "katz_infsa")
    assert dit_mixers()[-1] == "weightformer"
    assert f"--task generate takes DiT mixers as --models ({', '.join(dit_mixers())})" in capsys.readouterr().err


def _tiny_vae(folder):
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    blocks = dict(down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2)
    vae = AutoencoderKL(block_out_channels=(8, 16), layers_per_block=1, latent_channels=4, norm_num_groups=4, **blocks)
    vae.save_pretrained(folder)
    return vae


def test_latent_codec_scales_the_posterior_sample_as_dit_does(tmp_path):
    from linvit.generate.latent import LatentCodec

    vae = _tiny_vae(tmp_path / "vae")
    codec = LatentCodec(tmp_path / "vae")
    assert (codec.latent_channels, codec.downsample, codec.scale) == (4, 2, 0.18215)
    grey = torch.rand(2, 1, 32, 32) * 2 - 1
    latents = codec.encode(grey, torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = vae.encode(grey.expand(-1, 3, -1, -1)).latent_dist.sample(torch.Generator().manual_seed(3))
        assert torch.equal(latents, expected * 0.18215)  # grey images repeated to the VAE's RGB
        assert torch.allclose(codec.decode(latents), vae.decode(expected).sample, atol=1e-6)
    with pytest.raises(ValueError, match="not a multiple of the VAE's downsampling 2"):
        codec.latent_size(33)


def test_latent_diffusion_trains_on_the_vaes_latents_and_samples_pictures(tmp_path, capsys):
    _tiny_vae(tmp_path / "vae")
    run = tmp_path / "run"
    argv = ["generate", "train", "--data", DATA, "--output", str(run), "--vae", str(tmp_path / "vae"), "--epochs", "1"]
    argv += ["--batch-size", "32", "--workers", "0", "--val-images", "32", "--prediction", "v_prediction"]
    argv += ["--no-progress"]
    assert cli_main(argv) == 0
    info = json.loads((run / "config.json").read_text())["linvit"]
    assert (info["channels"], info["image_size"], info["pixel_size"]) == (4, 16, 32)  # the DiT sees 4 x 16 x 16
    assert info["prediction"] == "v_prediction"  # recorded: sample_images reads the objective from the run
    assert np.isfinite(_metrics(run)[-1]["val_loss"])
    out = tmp_path / "grid.png"
    sample = ["generate", "sample", "--checkpoint", str(run), "--classes", "1,2", "--num", "2", "--steps", "3"]
    assert cli_main([*sample, "--output", str(out), "--no-progress"]) == 0
    images = np.load(out.with_suffix(".npz"))["images"]
    assert images.shape == (2, 3, 32, 32) and 0 <= images.min() and images.max() <= 1  # decoded to pixels
    assert cli_main([*sample, "--side", "48", "--output", str(out), "--no-progress"]) == 0
    assert np.load(out.with_suffix(".npz"))["images"].shape == (2, 3, 48, 48)
    assert cli_main([*argv[:-1], "--no-progress", "--vae", str(tmp_path)]) == 2
    assert "not a folder written by diffusers' AutoencoderKL.save_pretrained" in capsys.readouterr().err


def test_ddim_clips_its_clean_image_estimate_to_the_pixel_range_only_when_asked():
    """clip=True (pixels): the last DDIM step returns the clipped x_0 estimate, so samples lie in [-1, 1] even
    for a noise prediction far off; clip=False (latents) keeps the unclipped values."""
    from types import SimpleNamespace

    from linvit.generate.diffusion import ddim_sample

    class WildNoise(torch.nn.Module):
        y_embedder = SimpleNamespace(num_classes=10)

        def forward_with_cfg(self, x, t, y, scale):
            return 5 * torch.ones_like(x)

    labels = torch.arange(4)
    clipped = ddim_sample(WildNoise(), labels, (1, 8, 8), steps=5, generator=torch.Generator().manual_seed(0))
    free = ddim_sample(WildNoise(), labels, (1, 8, 8), steps=5, generator=torch.Generator().manual_seed(0), clip=False)
    assert clipped.abs().max() <= 1 + 1e-6 and free.abs().max() > 2


def _small_dit(class_dropout: float, seed: int = 0):
    """A randomised tiny DiT (adaLN-Zero would start every block at exactly zero) and the batch sizes it sees."""
    from linvit.models.dit import DiT

    shape = dict(input_size=8, patch_size=2, in_channels=1, hidden_size=32, depth=1, num_heads=2, num_classes=10)
    model = DiT(**shape, class_dropout_prob=class_dropout, learn_sigma=False).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name != "pos_embed":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    batches = []
    model.register_forward_pre_hook(lambda module, inputs: batches.append(len(inputs[0])))
    return model, batches


def test_a_dit_trained_without_label_dropout_samples_at_guidance_one_only():
    """Issue 39 item 5: --class-dropout 0 leaves no "no class" row. Guidance 1 runs the conditional half
    alone (B images per step, not 2B), so such a model samples, and a model with the row gives the same
    samples (the row is not used); guidance above 1 on it is a UsageError naming --class-dropout."""
    from linvit.errors import UsageError
    from linvit.generate.diffusion import ddim_sample

    bare, seen = _small_dit(0.0)
    with_null, _ = _small_dit(0.1)
    state = bare.state_dict()
    table = with_null.y_embedder.embedding_table.weight
    state["y_embedder.embedding_table.weight"] = torch.cat([state["y_embedder.embedding_table.weight"], table[10:]])
    with_null.load_state_dict(state)
    labels = torch.tensor([3, 7, 1])

    def sample(model, guidance):
        return ddim_sample(
            model, labels, (1, 8, 8), steps=3, guidance=guidance, generator=torch.Generator().manual_seed(0)
        )

    images = sample(bare, 1.0)
    assert images.shape == (3, 1, 8, 8) and torch.isfinite(images).all() and seen == [3, 3, 3]
    assert torch.equal(sample(with_null, 1.0), images)
    assert not torch.equal(sample(with_null, 2.0), images)
    with pytest.raises(UsageError, match="--class-dropout"):
        sample(bare, 2.0)


def test_sample_a_run_trained_without_label_dropout(tmp_path, capsys):
    """`linvit generate sample` of a --class-dropout 0 run: --guidance 1 writes the grid, the default guidance
    (2) stops with one line naming --class-dropout (an IndexError from the embedding before)."""
    run = tmp_path / "run"
    train = ["generate", "train", "--data", DATA, "--output", str(run), "--epochs", "1", "--batch-size", "32"]
    train += ["--workers", "0", "--val-images", "32", "--class-dropout", "0", "--no-progress"]
    assert cli_main(train) == 0
    out = tmp_path / "grid.png"
    argv = ["generate", "sample", "--checkpoint", str(run), "--classes", "3,7", "--num", "2", "--steps", "2"]
    assert cli_main([*argv, "--output", str(out), "--no-progress", "--guidance", "1"]) == 0
    assert np.load(out.with_suffix(".npz"))["images"].shape == (2, 1, 32, 32)
    capsys.readouterr()
    assert cli_main([*argv, "--output", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--class-dropout" in err and len(err.splitlines()) == 1, err


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path):
    """generate sample writes its grid and arrays through atomic_write: a kill (here, an error) part-way leaves
    the previous file as it was, never a torn one that looks finished."""
    from linvit.utils.checkpoint import atomic_write

    target = tmp_path / "grid.npz"
    np.savez_compressed(target, images=np.zeros(3))

    def torn(tmp):
        tmp.write_bytes(b"half a fil")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, torn)
    assert np.load(target)["images"].tolist() == [0, 0, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["grid.npz"]
    atomic_write(target, lambda tmp: np.savez_compressed(tmp, images=np.ones(2)))  # the suffix picks the format
    assert np.load(target)["images"].tolist() == [1, 1] and sorted(p.name for p in tmp_path.iterdir()) == ["grid.npz"]


def test_an_image_folder_without_its_size_names_the_flag_help_lists(tmp_path):
    """It named --img-size, which `generate train --help` does not list; a missing folder says so first."""
    from PIL import Image

    from linvit.generate.engine import PixelImages

    (tmp_path / "train" / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "train" / "a" / "0.png")
    with pytest.raises(ValueError, match=r"image folders need --resize-crop PX"):
        PixelImages(str(tmp_path), "train", None)
    with pytest.raises(ValueError, match="not found"):
        PixelImages(str(tmp_path / "nope"), "train", None)
    assert PixelImages(str(tmp_path), "train", 8).size == 8
