"""The record types rlwire.Checks is tested on (test_checks.py, test_columns.py):
Structs shaped as RL frameworks declare them, a dataclass, unions of tagged Structs."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

import rlwire

# Framework-shaped types, as RL frameworks declare them.


class Experts(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    data: bytes
    shape: list[int]
    dtype: str


class MicroBatch(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    input_ids: list[int]
    loss_mask: list[bool]
    advantages: list[float]
    inference_logprobs: list[float]
    position_ids: list[int]
    temperature: float = 1.0
    routed_expert_ids: list[list[list[int]]] | None = None
    routed_experts: Experts | None = None
    mm: dict[str, Experts] | None = None


class Step(msgspec.Struct, array_like=True, gc=False, omit_defaults=True):
    micro_batches: list[MicroBatch]


# The same with plain Structs (renamed and tagged: attribute names are what Checks match).
class PlainMicroBatch(msgspec.Struct, rename="camel", tag=True):
    input_ids: list[int]
    loss_mask: list[bool]
    advantages: list[float]
    inference_logprobs: list[float]
    position_ids: list[int]
    temperature: float = 1.0
    routed_expert_ids: list[list[list[int]]] | None = None
    routed_experts: Experts | None = None
    mm: dict[str, Experts] | None = None


class PlainStep(msgspec.Struct):
    micro_batches: list[PlainMicroBatch]


FRAMEWORK = rlwire.Checks(
    finite=("inference_logprobs", "advantages"),
    same_length=(("input_ids", "loss_mask", "inference_logprobs", "routed_expert_ids"),),
    max_value={"routed_expert_ids": 255},
)


@dataclasses.dataclass
class Rollout:
    reward: float
    logprobs: list[float]


class Holder(msgspec.Struct, gc=False):
    tokens: list[int]  # cannot hold a named field: never looked into
    meta: int
    rollouts: dict[str, Rollout]
    extra: Any = None


class Text(msgspec.Struct, tag=True):
    text: str


class Scored(msgspec.Struct, tag=True):
    text: str
    score: float


class Turns(msgspec.Struct, array_like=True):
    turns: list[Text | Scored] | tuple[Scored, ...] | None
    rewards: list[list[float]] | dict[str, float]
