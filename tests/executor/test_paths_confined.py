"""A node's directives name its folders only under its roots (issue 24, item 4).

A data set error never lists a folder's content.
"""

from __future__ import annotations

import pytest

from services.executor.worker import data
from services.executor.worker.spec import TrainSpec


@pytest.mark.parametrize("kind", ["imagefolder", "clips"])
def test_a_data_set_error_names_the_folder_and_never_its_content(tmp_path, kind):
    for name in ("secret-a", "secret-b"):
        (tmp_path / name).mkdir()
    (tmp_path / "secret-a" / "0.png").write_bytes(b"")
    (tmp_path / "secret-a" / "0.pt").write_bytes(b"")
    video = dict(model="r3d_18", frames=2) if kind == "clips" else {}
    with pytest.raises(data.DataError) as err:
        data.load(TrainSpec(job_id="j", model=video.get("model", "resnet18"), dataset=f"{kind}:{tmp_path}",
                            frames=video.get("frames", 0)))
    what = "not every class folder holds an image file (.jpg" if kind == "imagefolder" else "1 of its 2 class folders hold no .pt clips"
    assert str(err.value).startswith(f"data folder {str(tmp_path)!r}: {what}"), err.value
    assert "secret" not in str(err.value)
