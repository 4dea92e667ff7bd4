"""MPICH start-up segments of dead jobs are removed before a job starts (runtime/stale_shm.py);
a segment some process maps, a young one, another file, or a link are left alone."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time

from autostrat.runtime.stale_shm import SETTLING_SECONDS, mapped_paths, remove_stale_segments


def _segment(folder, name: str, age: float = 60.0):
    path = folder / name
    path.write_bytes(b"\0" * 4096)
    old = time.time() - age
    os.utime(path, (old, old))
    return path


def test_only_old_unmapped_mpich_segments_of_this_user_are_removed(tmp_path):
    dead = _segment(tmp_path, "mpich_shm_5e1f_0")
    young = _segment(tmp_path, "mpich_shm_young_0", age=SETTLING_SECONDS / 2)
    other = _segment(tmp_path, "ucx_shm_posix_1")
    link = tmp_path / "mpich_shm_link_0"
    link.symlink_to(other)
    live = _segment(tmp_path, "mpich_shm_live_0")
    with open(live, "r+b") as handle, mmap.mmap(handle.fileno(), 4096):  # a live job maps its segment
        assert str(live) in mapped_paths()
        assert remove_stale_segments(tmp_path) == ["mpich_shm_5e1f_0"]
    assert not dead.exists() and young.exists() and other.exists() and link.is_symlink() and live.exists()


def test_a_segment_another_process_maps_is_kept(tmp_path):
    held = _segment(tmp_path, "mpich_shm_held_0")
    holder = subprocess.Popen([sys.executable, "-c", "import mmap, sys, time\n"
                               f"f = open({str(held)!r}, 'r+b'); m = mmap.mmap(f.fileno(), 4096)\n"
                               "print('mapped', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "mapped"
        assert remove_stale_segments(tmp_path) == [] and held.exists()
    finally:
        holder.kill()
        holder.wait()
    assert remove_stale_segments(tmp_path) == ["mpich_shm_held_0"]


def test_a_missing_folder_is_nothing_to_remove(tmp_path):
    assert remove_stale_segments(tmp_path / "absent") == []
