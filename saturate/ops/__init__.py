"""Op registry: one definition per op (flags, shape, kernel, cost, check drawing, C hooks)."""

from saturate.ops.cost import flops, nbytes, numel
from saturate.ops.infer import infer_type
from saturate.ops.registry import (OpDef, attach, define, domain_of, entries, find, lookup, ops_with, register,
                                   registered, unregister)

__all__ = ["OpDef", "attach", "define", "domain_of", "entries", "find", "flops", "infer_type", "lookup", "nbytes",
           "numel", "ops_with", "register", "registered", "unregister"]
