"""`linvit demo`: a Gradio page to try one or two trained models on your own pictures.

Upload a picture; each model shows its top-k labels and its importance map over the picture (the model's own
method by default, or the one chosen), side by side when two runs are given. Everything runs locally: the
server listens on 127.0.0.1 unless --host says otherwise, and nothing is shared or sent anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import torch.nn as nn
from PIL import Image
from timm.data import resolve_model_data_config

from .errors import UsageError
from .explain.maps import METHODS, importance_maps
from .explain.overlay import overlay, seen_box
from .inference import predict, prepare_image

AUTO = "model's own"


def _gradio():
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no calls home from an offline machine
    try:
        import gradio as gr
    except ImportError as err:
        raise UsageError("the demo needs Gradio: pip install 'linvit[demo]'") from err
    return gr


def look(model: nn.Module, picture: Image.Image, method: str | None = None, topk: int = 5):
    """({label: probability} of the top-k, overlay of the importance map on the picture, the method used)."""
    picture = picture.convert("RGB")
    tensor = prepare_image(picture, model)
    top = predict(model, [tensor], topk)[0]["topk"]
    maps = importance_maps(model, tensor[None], method, upsample=False)
    box = seen_box(picture.size, resolve_model_data_config(model))
    drawn = overlay(picture, maps.patch[0].numpy(), box)
    return {row["label"]: row["prob"] for row in top}, drawn, maps.method


def build_demo(models: Sequence[tuple[str, nn.Module]], topk: int = 5):
    """A gr.Blocks page: one picture and a method in, per model a label panel and an overlay out."""
    gr = _gradio()
    if not 1 <= len(models) <= 2:
        raise UsageError(f"the demo compares one or two models, got {len(models)}")
    for _, model in models:
        model.eval()

    def run(picture, method):
        if picture is None:
            raise gr.Error("upload a picture first")
        outputs = []
        for _, model in models:
            try:
                labels, drawn, used = look(model, picture, None if method == AUTO else method, topk)
            except UsageError as err:  # e.g. a method the model has no layers for
                raise gr.Error(str(err)) from err
            outputs += [labels, drawn, f"map method: **{used}**"]
        return outputs

    with gr.Blocks(title="linvit demo") as demo:
        gr.Markdown("# linvit: predictions and importance maps on your own pictures")
        with gr.Row():
            picture = gr.Image(type="pil", label="picture", elem_id="picture", image_mode="RGB")
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
        button.click(run, [picture, method], outputs)
    return demo


def load_models(args) -> list[tuple[str, nn.Module]]:
    """--checkpoint RUN [RUN] (run folders), or --model NAME (random weights, for a first look)."""
    from .runs import load_run

    if args.checkpoint:
        return [(str(run), load_run(run)) for run in args.checkpoint]
    if args.model:
        from .models import create_any_size

        torch.manual_seed(0)
        return [(f"{args.model} (random weights)", create_any_size(args.model))]
    raise UsageError("give --checkpoint RUN [RUN] (one or two run folders) or --model NAME")


def run_demo(args) -> None:
    """`linvit demo`: serve the page until interrupted."""
    if args.checkpoint and len(args.checkpoint) > 2:
        raise UsageError(f"--checkpoint takes one or two run folders, got {len(args.checkpoint)}")
    demo = build_demo(load_models(args), args.topk)
    print(f"linvit demo on http://{args.host}:{args.port} (Ctrl+C to stop)")
    serve(demo, args.host, args.port)


def serve(demo, host: str = "127.0.0.1", port: int = 7860, block: bool = True) -> None:
    """Start the page's server on host:port (never a public share link); block=False returns at once."""
    demo.launch(server_name=host, server_port=port, share=False, inbrowser=False, prevent_thread_lock=not block)
