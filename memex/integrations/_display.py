"""What a front end shows of a cell besides its text, computed in the guest: the matplotlib
figures a cell left open (as PNGs, then closed, like an inline backend) and the rich reprs of
its final value (``_repr_html_`` and friends). Shared by ``memex mcp`` and the Jupyter kernel.

``PRELUDE`` runs once per guest: it notes when ``matplotlib.pyplot`` is imported (an audit
hook calls door op ``display.pyplot``, so the host asks for figures only when there can be
some) and defines two builtins the host calls after a cell: ``__memex_figures__()`` sends each
open figure to door op ``display.figure`` (PNG bytes), ``__memex_bundle__()`` sends the mime
bundle of ``builtins._`` (the cell's value) to ``display.bundle`` (``__memex_bundle_of__``
computes any value's).
"""

from __future__ import annotations

__all__ = ["BUNDLE_CALL", "FIGURES_CALL", "MAX_FIGURES", "PRELUDE"]

MAX_FIGURES = 8
FIGURES_CALL = "__memex_figures__()"
BUNDLE_CALL = "__memex_bundle__()"

PRELUDE = r'''
def __memex_display_prelude__():
    import builtins, sys
    import memex_guest
    seen = [False]
    def audit(event, args):
        if event == "import" and not seen[0] and args and args[0] == "matplotlib.pyplot":
            seen[0] = True
            try:
                memex_guest.call("display.pyplot")
            except Exception:
                pass
    sys.addaudithook(audit)
    def figures():
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        import io
        for num in plt.get_fignums()[:MAX_FIGURES]:
            buf = io.BytesIO()
            plt.figure(num).savefig(buf, format="png", dpi=100, bbox_inches="tight")
            memex_guest.call("display.figure", buf.getvalue())
        plt.close("all")
    reprs = (("_repr_html_", "text/html"), ("_repr_markdown_", "text/markdown"),
             ("_repr_latex_", "text/latex"), ("_repr_svg_", "image/svg+xml"),
             ("_repr_png_", "image/png"), ("_repr_jpeg_", "image/jpeg"),
             ("_repr_json_", "application/json"))
    def bundle_of(value):
        out = {}
        mimebundle = getattr(type(value), "_repr_mimebundle_", None)
        if mimebundle is not None:
            try:
                data = mimebundle(value)
                if isinstance(data, tuple):
                    data = data[0]
                if isinstance(data, dict):
                    out.update({k: v for k, v in data.items() if isinstance(k, str)})
            except Exception:
                pass
        for name, mime in reprs:
            method = getattr(type(value), name, None)
            if method is None or mime in out:
                continue
            try:
                data = method(value)
            except Exception:
                continue
            if isinstance(data, tuple):
                data = data[0]
            if data is not None:
                out[mime] = data
        for mime, data in list(out.items()):
            if not isinstance(data, (str, bytes, dict, list)):
                del out[mime]
        return out
    def bundle():
        out = bundle_of(getattr(builtins, "_", None))
        if out:
            memex_guest.call("display.bundle", out)
    builtins.__memex_figures__ = figures
    builtins.__memex_bundle__ = bundle
    builtins.__memex_bundle_of__ = bundle_of
__memex_display_prelude__()
del __memex_display_prelude__
'''.replace("MAX_FIGURES", str(MAX_FIGURES))
