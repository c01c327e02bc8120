"""The functions that make rows from columns: the same rows as the plain way, whatever
the names, with no name from a message ever compiled."""

from __future__ import annotations

import msgspec
import numpy as np

from rlwire import TrainingSample
from rlwire.codecs._msgpack.row_makers import dict_maker, list_maker, struct_maker


def test_a_struct_is_made_with_its_fields_as_keywords() -> None:
    attrs = ("token_ids", "mask", "logprobs", "temperatures", "advantages", "env_name")
    make = struct_maker(TrainingSample, attrs)
    ids, mask, floats = np.arange(3), np.ones(3, bool), np.zeros(3, np.float32)
    values = (ids, mask, floats, floats, floats, "gsm8k")
    made = make(*values)
    assert made == TrainingSample(**dict(zip(attrs, values, strict=True)))
    assert made.token_ids is ids  # the value itself, not a copy


def test_fields_python_cannot_spell_as_keywords_are_passed_the_plain_way() -> None:
    odd = msgspec.defstruct("Odd", ["class", "def", "ok"])
    make = struct_maker(odd, ("class", "def", "ok"))
    assert make(1, 2, 3) == odd(**{"class": 1, "def": 2, "ok": 3})


def test_names_from_a_message_are_keys_never_code() -> None:
    names = ("}: 1, {'x", "__import__('os').system('false')", "a\nb", "")
    make = dict_maker(names)
    assert make(1, 2, 3, 4) == dict(zip(names, (1, 2, 3, 4), strict=True))


def test_rows_of_many_columns_are_made_too() -> None:
    names = tuple(f"c{i}" for i in range(300))
    assert dict_maker(names)(*range(300)) == {f"c{i}": i for i in range(300)}
    many = msgspec.defstruct("Many", list(names))
    assert struct_maker(many, names)(*range(300)) == many(*range(300))
    assert list_maker(1, "a") == [1, "a"]
