"""Published drafters in, trained drafters out (issue 20): load EAGLE-3, EAGLE-1/2, DFlash and
DSpark checkpoints (`--set path=DIR_OR_HUB_ID`), the native MTP layers a target checkpoint ships
(`mtp`, native_mtp.py), and export the shipped drafters in those layouts (export.py).

Boundary: `build` turns a strategy id, a target and the strategy's settings (with `path`) into a
drafter of the shipped classes over the folder's weights. Layout detection and file checks:
folder.py; names: names.py; heads: eagle.py; block drafters: block.py; native MTP:
native_mtp.py.
"""
from __future__ import annotations

from specviz.drafters.published.folder import LAYOUT_NAMES, open_folder

# strategy id -> the layout its drafter can run
LAYOUT_OF = {"eagle1": "eagle1", "eagle2": "eagle1", "eagle3": "eagle3", "dflash": "dflash",
             "dspark": "dspark"}


def build(strategy_id: str, target, settings):
    """The strategy's drafter over the published folder `settings.path`."""
    from specviz.drafters.base import DrafterUnavailable
    if strategy_id == "mtp":                   # path=native: the target checkpoint's own layers
        from specviz.drafters.published import native_mtp
        return native_mtp.build(target, settings)
    if strategy_id not in LAYOUT_OF:
        raise DrafterUnavailable(f"strategy {strategy_id} takes no published drafter (path= works "
                                 f"with {', '.join(LAYOUT_OF)})")
    folder = open_folder(settings.path)
    want = LAYOUT_OF[strategy_id]
    if folder.layout != want:
        raise DrafterUnavailable(
            f"{settings.path} is a {LAYOUT_NAMES[folder.layout]} drafter; strategy "
            f"{strategy_id} needs {LAYOUT_NAMES[want]} (use strategy "
            f"{next(s for s, lay in LAYOUT_OF.items() if lay == folder.layout)})")
    if want in ("eagle1", "eagle3"):
        from specviz.drafters.eagle import EagleDrafter
        from specviz.drafters.eagle3 import Eagle3Drafter
        from specviz.drafters.published.eagle import load_eagle1, load_eagle3
        from specviz.engine.cost import forward_cost
        if strategy_id == "eagle1":
            return EagleDrafter(load_eagle1(folder, target), None)
        auto = settings.auto_budget and getattr(settings, "mode", "tree") == "tree"
        cost = forward_cost(target) if auto else None
        if strategy_id == "eagle2":
            return EagleDrafter(load_eagle1(folder, target), settings, cost)
        return Eagle3Drafter(load_eagle3(folder, target), settings, cost)
    from specviz.drafters.published.block import dflash_drafter, dspark_drafter
    return (dflash_drafter if want == "dflash" else dspark_drafter)(folder, target, settings)
