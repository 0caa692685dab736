"""unihook: one hook function for PyTorch and PaddlePaddle.

``import unihook`` imports no framework: backends are pluggy plugins found through the
``unihook`` entry-point group, and each looks its framework up in ``sys.modules``.
"""

from __future__ import annotations

from . import ops
from .api import (
    backend_of,
    backends,
    register_forward_hook,
    register_forward_post_hook,
    register_forward_pre_hook,
    register_full_backward_hook,
    register_full_backward_pre_hook,
    register_tensor_hook,
)
from .capture import Capture, capture
from .compose import HookGroup, Where, attach, select
from .errors import (
    BackendStateError,
    DispatchersOnlyError,
    HookArgumentError,
    HookReturnError,
    HookReturnTypeError,
    HookTargetError,
    InPlaceError,
    NoBackendError,
    NoGradError,
    ScriptedHookError,
    StaleCaptureError,
    TargetKindError,
    TracedHookError,
    UnihookError,
    UnsupportedHookError,
)
from .global_hooks import (
    register_module_buffer_registration_hook,
    register_module_forward_hook,
    register_module_forward_pre_hook,
    register_module_full_backward_hook,
    register_module_full_backward_pre_hook,
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)
from .handles import Handle
from .hooktypes import (
    BackwardHook,
    BackwardPreHook,
    ForwardHook,
    ForwardHookWithKwargs,
    ForwardPreHook,
    ForwardPreHookWithKwargs,
    ModuleKind,
    RegistrationHook,
    TensorHook,
    When,
)
from .info import BackendInfo, HookKind, Support

# The one place the version is written: pyproject.toml reads it ([tool.setuptools.dynamic]),
# and `import unihook` stays free of importlib.metadata.
__version__ = "0.1.0"

__all__ = [
    "BackendInfo",
    "BackwardHook",
    "BackwardPreHook",
    "ForwardHook",
    "ForwardHookWithKwargs",
    "ForwardPreHook",
    "ForwardPreHookWithKwargs",
    "HookKind",
    "ModuleKind",
    "RegistrationHook",
    "Support",
    "TensorHook",
    "When",
    "Capture",
    "HookGroup",
    "Where",
    "attach",
    "capture",
    "ops",
    "select",
    "BackendStateError",
    "HookArgumentError",
    "Handle",
    "HookReturnError",
    "HookReturnTypeError",
    "HookTargetError",
    "InPlaceError",
    "DispatchersOnlyError",
    "NoBackendError",
    "NoGradError",
    "StaleCaptureError",
    "TargetKindError",
    "TracedHookError",
    "ScriptedHookError",
    "UnihookError",
    "UnsupportedHookError",
    "backend_of",
    "backends",
    "register_forward_hook",
    "register_forward_post_hook",
    "register_forward_pre_hook",
    "register_module_buffer_registration_hook",
    "register_module_forward_hook",
    "register_module_forward_pre_hook",
    "register_module_full_backward_hook",
    "register_module_full_backward_pre_hook",
    "register_module_module_registration_hook",
    "register_module_parameter_registration_hook",
    "register_full_backward_hook",
    "register_full_backward_pre_hook",
    "register_tensor_hook",
]
