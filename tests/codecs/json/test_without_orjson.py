"""Without orjson (``pip install rlwire`` without ``[json]``), every JSON face raises
ConfigError naming the extra, as the codec option does (docs/how-to/send.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

TRIES = {
    "codec": "rlwire.open_sync_sender(tempfile.mkdtemp(), codec='json').send({'a': 1})",
    "jsonl": "import rlwire.codecs.jsonl",
    "JsonCodec": "from rlwire.codecs import JsonCodec",
}


@pytest.mark.parametrize("face", list(TRIES))
def test_a_json_face_without_orjson_names_the_extra(face: str) -> None:
    code = f"""
        import sys
        sys.modules["orjson"] = None  # as if it were not installed
        import tempfile
        import rlwire
        try:
            {TRIES[face]}
        except rlwire.ConfigError as exc:
            print("ConfigError:", exc)
        except Exception as exc:
            print("untyped:", type(exc).__name__, exc)
        """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ConfigError:"), done.stdout
    assert "pip install 'rlwire[json]'" in done.stdout, done.stdout
