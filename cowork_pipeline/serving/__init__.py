"""OpenAI-compatible HTTP serving of any ``Agent`` (e.g. the SFT-trained student via ``HFAgent``)."""
from cowork_pipeline.serving.server import make_app, serve

__all__ = ["make_app", "serve"]
