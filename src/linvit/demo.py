"""`linvit demo`: a Gradio page to try one or two trained models on your own pictures.

Upload a picture; each model shows its top-k labels and its importance map over the picture (the model's own
method by default, or the one chosen), side by side when two runs are given. Everything runs locally: the
server listens on 127.0.0.1 unless --host says otherwise, and nothing is shared or sent anywhere.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn as nn
from timm.data import resolve_model_data_config

from .config import Config
from .data.images import read_rgb
from .errors import UsageError
from .explain.maps import METHODS, importance_maps
from .explain.overlay import overlay, seen_box
from .prediction import predict, prepare_image

AUTO = "model's own"


def _gradio():
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home from an offline machine
    try:
        import gradio as gr
    except ImportError as err:
        raise UsageError("the demo needs Gradio: pip install 'linvit[demo]'") from err
    return gr


def look(model: nn.Module, path: str | Path, method: str | None = None, topk: int = 5, amp: str = "auto"):
    """({label: probability} of the top-k, overlay of the importance map on the picture, the method used); the
    top-k under predict's precision (amp), the map in float32.

    The picture is read as `linvit predict` reads it (linvit.load_image: read_rgb, then prepare_image), so a
    16-bit or EXIF-rotated file gives the same answer here as on the command line."""
    picture = read_rgb(path)
    tensor = prepare_image(picture, model)
    top = predict(model, [tensor], topk, amp=amp)[0]["topk"]
    maps = importance_maps(model, tensor[None], method, upsample=False)
    box = seen_box(picture.size, resolve_model_data_config(model))
    drawn = overlay(picture, maps.patch[0].numpy(), box)
    return {row["label"]: row["prob"] for row in top}, drawn, maps.method


def upload_path(payload) -> str | None:
    """The uploaded file of gr.Image's raw payload (a dict with its cached "path"), or a path as given.

    The click runs with preprocess=False: Gradio's own preprocessing opens the file with PIL and converts it
    (16-bit to white, an undecodable file to a generic error) before linvit could read it."""
    if payload is None or isinstance(payload, (str, Path)):
        return None if payload is None else str(payload)
    return payload.get("path")


def answer(models: Sequence[tuple[str, nn.Module]], picture, method: str, topk: int = 5, amp: str = "auto") -> list:
    """What the page shows for one upload: per model its top-k, its overlay and the method; a picture that
    cannot be read is the one-line UsageError the command line gives."""
    path = upload_path(picture)
    if path is None:
        raise UsageError("upload a picture first")
    name = picture.get("orig_name") if isinstance(picture, dict) else None
    outputs = []
    for _, model in models:
        try:
            labels, drawn, used = look(model, path, None if method == AUTO else method, topk, amp)
        except UsageError as err:  # named by the file the user uploaded, not Gradio's cached copy
            raise UsageError(str(err).replace(path, name or path)) from err
        outputs += [labels, drawn, f"map method: **{used}**"]
    return outputs


def build_demo(models: Sequence[tuple[str, nn.Module]], topk: int = 5, amp: str = "auto"):
    """A gr.Blocks page: one picture and a method in, per model a label panel and an overlay out."""
    gr = _gradio()
    if not 1 <= len(models) <= 2:
        raise UsageError(f"the demo compares one or two models, got {len(models)}")
    for _, model in models:
        model.eval()

    def run(picture, method):
        try:
            return answer(models, picture, method, topk, amp)
        except UsageError as err:  # an unreadable upload, a method the model has no layers for
            raise gr.Error(str(err)) from err

    with gr.Blocks(title="linvit demo") as demo:
        gr.Markdown("# linvit: predictions and importance maps on your own pictures")
        with gr.Row():
            picture = gr.Image(type="filepath", label="picture", elem_id="picture", image_mode=None)
            with gr.Column():
                method = gr.Dropdown([AUTO, *METHODS], value=AUTO, label="map method", elem_id="method")
                button = gr.Button("Run", variant="primary", elem_id="run")
        outputs = []
        with gr.Row():
            for i, (name, _) in enumerate(models):
                with gr.Column():
                    gr.Markdown(f"### {name}")
                    outputs.append(gr.Label(num_top_classes=topk, label="top-k", elem_id=f"labels-{i}"))
                    outputs.append(gr.Image(type="pil", label="importance map", elem_id=f"map-{i}"))
                    outputs.append(gr.Markdown(elem_id=f"method-{i}"))
        button.click(run, [picture, method], outputs, preprocess=False)  # linvit reads the file (upload_path)
    return demo


@dataclasses.dataclass
class DemoConfig(Config):
    """`linvit demo`: one or two run folders (or a model name, random weights) and where the page listens."""

    checkpoint: list[str] | None = None
    model: str | None = None
    topk: int = 5
    amp: str = "auto"  # the top-k's precision, as `linvit predict`'s (bf16 on a CPU with native bf16 products)
    host: str = "127.0.0.1"  # this machine only
    port: int = 7860


def load_models(config: DemoConfig) -> list[tuple[str, nn.Module]]:
    """--checkpoint RUN [RUN] (run folders), or --model NAME (random weights, for a first look)."""
    from .runs import load_run

    if config.checkpoint:
        return [(str(run), load_run(run)) for run in config.checkpoint]
    if config.model:
        from .models import create_any_size

        torch.manual_seed(0)
        return [(f"{config.model} (random weights)", create_any_size(config.model))]
    raise UsageError("give --checkpoint RUN [RUN] (one or two run folders) or --model NAME")


def run_demo(config: DemoConfig) -> None:
    """`linvit demo`: serve the page until interrupted."""
    if config.checkpoint and len(config.checkpoint) > 2:
        raise UsageError(f"--checkpoint takes one or two run folders, got {len(config.checkpoint)}")
    demo = build_demo(load_models(config), config.topk, config.amp)
    print(f"linvit demo on http://{config.host}:{config.port} (Ctrl+C to stop)")
    serve(demo, config.host, config.port)


def serve(demo, host: str = "127.0.0.1", port: int = 7860, block: bool = True) -> None:
    """Start the page's server on host:port (never a public share link); block=False returns at once."""
    demo.launch(server_name=host, server_port=port, share=False, inbrowser=False, prevent_thread_lock=not block)
