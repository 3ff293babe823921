"""arctic-sdk's opt-in alias of Arctic-Platform's client modules (see compat-alias/README.md).

`rl` and `client` resolve to `arctic_sdk.compat`; any other `arctic_platform` module comes from
a real Arctic-Platform install later on `sys.path`, if there is one.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

ARCTIC_SDK_ALIAS = True
