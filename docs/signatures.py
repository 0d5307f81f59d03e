"""A griffe extension for the API reference: a class whose ``__init__`` takes ``**dials`` and whose runtime
``__signature__`` spells them out (the algorithm objects: every field of ``adloco.RoundOptions``, with the
default the method gives it) shows that signature, as ``help()`` does, instead of ``**dials``."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from griffe import Class, Extension, Function, Parameter, ParameterKind, Parameters

KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: ParameterKind.var_keyword,
}


class SpelledOutSignatures(Extension):
    def on_class(self, *, cls: Class, **kwargs: Any) -> None:
        init = cls.members.get("__init__")
        if not isinstance(init, Function) or not any(
            p.kind is ParameterKind.var_keyword for p in init.parameters
        ):
            return
        module, _, name = cls.path.rpartition(".")
        sig = vars(getattr(importlib.import_module(module), name)).get("__signature__")
        if sig is None:
            return
        spelled = [
            Parameter(
                p.name,
                annotation=None if p.annotation is p.empty else str(p.annotation),
                kind=KINDS[p.kind],
                default=None if p.default is p.empty else repr(p.default),
            )
            for p in sig.parameters.values()
        ]
        init.parameters = Parameters(Parameter("self", kind=ParameterKind.positional_or_keyword), *spelled)
