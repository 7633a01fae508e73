"""The port's TinyPort text-to-image pipeline: the transformer, then the
image head, each loaded from the official checkpoint through its mapping.

Module names: ``transformer.*`` (fastvideo.models.dits.tinyport) and
``head``, ``head.norm``, ``head.out``.
"""

import numpy as np

from fastvideo.models.dits.tinyport import TinyPortArchConfig, TinyPortDiT
from fastvideo.models.heads.tinyport_head import HeadArchConfig, TinyPortImageHead
from fastvideo.models.loader.tinyport_head_mapping import convert_head_state_dict
from fastvideo.models.loader.tinyport_mapping import convert_official_state_dict


class TinyPipePipeline:
    def __init__(self, official_sd: dict):
        body = {k: v for k, v in official_sd.items() if not k.startswith("head.")}
        self.transformer = TinyPortDiT(convert_official_state_dict(body), TinyPortArchConfig())
        self.head = TinyPortImageHead(convert_head_state_dict(official_sd), HeadArchConfig())

    def __call__(self, input_ids):
        return self.head(self.transformer(np.asarray(input_ids)))
