"""The controls of the explorers of :mod:`attnopt.course.widgets`: ``ipywidgets`` sliders and menus, made alike.

Every control gets the same style (the whole description shown, no update while a slider is being
dragged), and a slider first checks, through :mod:`attnopt._validation`, that its initial value lies
in its range, naming the explorer's argument.  ``ipywidgets`` is imported only when a control is
made: importing this module needs nothing beyond the library.
"""

from __future__ import annotations

import math

from .._optional import require
from .._validation import check_number


def widgets():
    """The ``ipywidgets`` module (an ``ImportError`` naming ``attnopt[notebook]`` without it)."""
    return require("ipywidgets", "the controls of attnopt.widgets")


def style() -> dict:
    """The keyword arguments every control is made with."""
    return dict(style={"description_width": "initial"}, continuous_update=False)


def log_slider(value: float, name: str, low: float, high: float, description: str):
    """A log-scale slider from ``low`` to ``high`` (powers of ten), after checking ``value`` lies there."""
    value = check_number(value, name, low=low, high=high)
    return widgets().FloatLogSlider(value=value, base=10, min=math.log10(low), max=math.log10(high), step=0.05,
                                    description=description, readout_format=".3g", **style())


def slider(value: float, name: str, low: float, high: float, step: float, description: str):
    """A slider from ``low`` to ``high`` in steps of ``step``, after checking ``value`` lies there."""
    value = check_number(value, name, low=low, high=high)
    return widgets().FloatSlider(value=value, min=low, max=high, step=step, description=description,
                                 readout_format=".2f", **style())


def int_slider(value: int, high: int, description: str):
    """A slider over the integers ``0, ..., high`` (``value`` already checked)."""
    return widgets().IntSlider(value=value, min=0, max=high, description=description, **style())


def dropdown(options: list, value, description: str):
    """A menu of ``options``, pairs ``(label, value)``, showing ``value`` (already checked)."""
    return widgets().Dropdown(options=options, value=value, description=description, style=style()["style"])
