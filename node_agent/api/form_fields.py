"""The text fields of a ``multipart/form-data`` body: where an audio upload names its model.

llama.cpp's HTTP layer turns a multipart POST's text fields into a JSON object (a name given
twice becomes an array) and the router reads ``model`` from it (server-http.cpp). The body
itself is forwarded to the child as it came.
"""

from __future__ import annotations

import email.parser
import email.policy
from email.message import EmailMessage
from typing import Any

MULTIPART = "multipart/form-data"


def multipart_fields(content_type: str, body: bytes) -> dict[str, Any]:
    """The form's text fields (parts without a file name), by name."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    fields: dict[str, Any] = {}
    if not isinstance(message, EmailMessage) or not message.is_multipart():
        return fields  # no parts: no model (llama.cpp: "model name is missing")
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or part.get_filename() is not None:
            continue  # a file, or a part without a name
        payload = part.get_payload(decode=True)
        value = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
        if name not in fields:
            fields[name] = value
        elif isinstance(fields[name], list):
            fields[name].append(value)
        else:
            fields[name] = [fields[name], value]
    return fields
