"""Reference networks built in code with ``torch.nn`` (torchvision's wheel needs CUDA torch here).

``resnet18`` follows torchvision's ``resnet18`` layout exactly (``conv1``/``bn1``/``relu``/``maxpool``,
``layer1`` .. ``layer4`` of two ``BasicBlock`` each with a 1x1 ``downsample`` conv + BN where the
stride or width changes, ``avgpool``, ``fc``), so a torchvision state dict loads into it and the ONNX
node names match torchvision's export (``/layer1/layer1.0/conv1/Conv``, ``/layer1/layer1.0/Add`` ...).

``resnet18_onnx`` exports it with the TorchScript exporter in eval mode at a fixed batch x 3 x 224 x 224,
opset 17. BatchNormalization is **folded** into the preceding Conv by the exporter (eval-mode export
fuses Conv+BN), which is what TensorRT does too, so each block reads
``Conv -> Relu -> Conv -> Add(skip) -> Relu`` with the skip either the block input or the
``downsample`` Conv's output. Weights are seeded (He-normal convs, BN at unit scale with small seeded
statistics), not trained: the network is a structure and latency reference, not a classifier.
"""
from __future__ import annotations

import io
import warnings

from .samples import _export_minilm, sentence_embedding

OPSET = 17


def _block_class():
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample
            self.stride = stride

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            out = out + identity
            return self.relu(out)

    return BasicBlock


def resnet18(num_classes: int = 1000):
    """ResNet-18 in torchvision's module layout (``torchvision.models.resnet18`` without the download)."""
    import torch
    from torch import nn

    block = _block_class()

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            self.layer1 = self._make_layer(64, 2)
            self.layer2 = self._make_layer(128, 2, stride=2)
            self.layer3 = self._make_layer(256, 2, stride=2)
            self.layer4 = self._make_layer(512, 2, stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512, num_classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.constant_(m.weight, 1)
                    nn.init.constant_(m.bias, 0)

        def _make_layer(self, planes: int, blocks: int, stride: int = 1):
            downsample = None
            if stride != 1 or self.inplanes != planes:
                downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False),
                                           nn.BatchNorm2d(planes))
            layers = [block(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes
            layers += [block(planes, planes) for _ in range(1, blocks)]
            return nn.Sequential(*layers)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return ResNet()


def _seed_batchnorm(model, generator) -> None:
    """Small seeded BN statistics so the folded conv biases are not all zero (a realistic range mix)."""
    import torch
    from torch import nn

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(0.1 * torch.randn(n, generator=generator))
                m.running_var.copy_(1.0 + 0.1 * torch.rand(n, generator=generator))
                m.bias.copy_(0.05 * torch.randn(n, generator=generator))


def resnet18_onnx(batch: int = 32, seed: int = 0, num_classes: int = 1000) -> bytes:
    """ResNet-18 (seeded weights, eval mode, BN folded into Conv) as ONNX bytes, input ``input``
    [batch, 3, 224, 224] -> ``output`` [batch, num_classes], opset 17, fixed batch."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = resnet18(num_classes)
    _seed_batchnorm(model, generator)
    model.eval()
    example = torch.randn(batch, 3, 224, 224, generator=generator)
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript-exporter deprecation warnings
        torch.onnx.export(model, (example,), buf, dynamo=False, opset_version=OPSET,
                          input_names=["input"], output_names=["output"], do_constant_folding=True)
    return buf.getvalue()


def _branchy_class():
    import torch
    from torch import nn

    class Branchy(nn.Module):
        """conv -> two conv branches -> Concat -> MaxPool -> conv + residual Add -> Relu -> GAP -> fc."""

        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, 1, 1)
            self.left = nn.Conv2d(8, 8, 3, 1, 1)
            self.right = nn.Conv2d(8, 8, 1)
            self.mix = nn.Conv2d(16, 16, 3, 1, 1)
            self.fc = nn.Linear(16, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(self.stem(x))
            x = torch.cat([torch.relu(self.left(x)), torch.relu(self.right(x))], dim=1)
            x = torch.max_pool2d(x, 2)
            x = torch.relu(self.mix(x) + x)
            return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return Branchy


def branchy_onnx(batch: int = 2, seed: int = 0) -> bytes:
    """A small CNN with every INT8 placement op (a float Concat of two conv branches, MaxPool, a
    residual Add after a conv, GlobalAveragePool), seeded, input ``input`` [batch, 3, 16, 16] ->
    ``output`` [batch, 10], opset 17."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _branchy_class()().eval()
        example = torch.randn(batch, 3, 16, 16)
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), buf, dynamo=False, opset_version=OPSET,
                          input_names=["input"], output_names=["output"], do_constant_folding=True)
    return buf.getvalue()


BERT_SIZES = {"bert-base": {"hidden": 768, "layers": 12, "heads": 12, "intermediate": 3072},
              "bert-large": {"hidden": 1024, "layers": 24, "heads": 16, "intermediate": 4096}}


def bert_onnx(size: str = "bert-base", layers: int | None = None, vocab: int = 30522, seed: int = 0) -> bytes:
    """``transformers.BertModel`` of ``size`` (:data:`BERT_SIZES`; ``layers`` overrides the depth), seeded
    random weights, no download, with the minilm sample's mean pooling, exported as that sample is
    (TorchScript, opset 17, dynamic batch and sequence; inputs input_ids / attention_mask / token_type_ids).
    A structure and latency reference (the estimator's transformer fit and tests), not a language model."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np
    import torch
    from transformers import BertConfig, BertModel

    s = BERT_SIZES[size]
    torch.manual_seed(seed)
    cfg = BertConfig(hidden_size=s["hidden"], num_hidden_layers=layers or s["layers"], num_attention_heads=s["heads"],
                     intermediate_size=s["intermediate"], vocab_size=vocab, attn_implementation="eager")
    module = sentence_embedding(BertModel(cfg, add_pooling_layer=False).eval())
    rng = np.random.default_rng(seed)
    example = {"input_ids": rng.integers(0, vocab, (2, 16), dtype=np.int64),
               "attention_mask": np.ones((2, 16), dtype=np.int64), "token_type_ids": np.zeros((2, 16), dtype=np.int64)}
    return _export_minilm(module, example)
