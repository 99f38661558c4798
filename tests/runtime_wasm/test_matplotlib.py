"""matplotlib draws inside the guest; the host fetches the figure from the sandbox's /tmp."""

from __future__ import annotations

import pytest

from memex import Limits, Sandbox


@pytest.mark.slow
def test_figure_saved_in_guest_is_readable_from_host() -> None:
    with Sandbox(limits=Limits(timeout=120)) as sb:
        r = sb.run(
            "import matplotlib\n"
            "import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(figsize=(2, 2))\n"
            "ax.plot([1, 2, 3], [3, 1, 2])\n"
            "ax.set_title('memex')\n"
            "fig.savefig('/tmp/fig.png', dpi=50)\n"
            "matplotlib.get_backend()"
        )
        assert r.ok, r.exception
        assert r.value is not None and "agg" in r.value.lower()
        png = sb.read_file("/tmp/fig.png")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 500
