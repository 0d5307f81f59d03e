"""The Hugging Face hub, used only when a config names something on it, and never slowly.

Offline (``HF_HUB_OFFLINE=1``), names load from the local Hugging Face cache or fail at once. Online, a
short TCP check comes first: an unreachable hub is one clear line within seconds, never a minute of
retries inside ``datasets`` or ``huggingface_hub``.
"""

from __future__ import annotations

import os
import re
import socket
from urllib.parse import urlparse

from adloco.errors import UserError

_TRUE = {"1", "true", "yes", "on"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def offline() -> bool:
    return any(
        os.environ.get(v, "").lower() in _TRUE
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def looks_like_hub_name(text: str) -> bool:
    """``owner/name`` or ``name``: what a hub repository id can look like."""
    return bool(_NAME.match(text))


def unreachable(timeout: float = 3.0) -> str | None:
    """None when the hub endpoint accepts a TCP connection within ``timeout`` s, else why not."""
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"


def require(field: str, name: str, local_hint: str) -> None:
    """Check that hub name ``name`` (config field ``field``) can be fetched now, or fail in one line.

    Offline mode is left to the loaders (they read the local cache and fail fast); online, the hub must
    answer a TCP connection.
    """
    if offline():
        return
    why = unreachable()
    if why is not None:
        raise UserError(
            f"config: {field} = {name!r}: a Hugging Face hub name, but the hub is unreachable ({why}); "
            f"if it is in your Hugging Face cache set HF_HUB_OFFLINE=1, otherwise {local_hint}"
        )


def offline_error(field: str, name: str, local_hint: str) -> UserError:
    return UserError(
        f"config: {field} = {name!r}: not a local path, and not in the Hugging Face cache while offline "
        f"(HF_HUB_OFFLINE=1); {local_hint}"
    )
