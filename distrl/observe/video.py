"""Videos of an agent: RGB frames to a playable mp4 (H.264 through the ffmpeg that imageio-ffmpeg ships,
so no system ffmpeg and no moviepy), to an animated GIF for TensorBoard's image tab, and back to frames.

gymnasium's `RecordVideo` and TensorBoard's `add_video` both need moviepy (TensorBoard's needs its 1.x
API and, without it, writes nothing and raises nothing), so neither is used.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from distrl.config import ConfigError

GIF_WIDTH = 160       # TensorBoard shows the GIF as an image: small is enough, and a long one stays light
GIF_MAX_FRAMES = 300  # longer episodes are sampled evenly down to this many frames


class VideoError(ConfigError):
    """An env that cannot be filmed: one line for the user (exit status 2)."""


def check_frame(frame, env_id: str) -> np.ndarray:
    """An env's render() as an (H, W, 3) uint8 image, or VideoError naming the env."""
    arr = None if frame is None else np.asarray(frame)
    if arr is None or arr.ndim != 3 or arr.shape[2] not in (3, 4) or arr.shape[0] < 2 or arr.shape[1] < 2:
        got = "nothing" if arr is None else f"an array of shape {arr.shape}"
        raise VideoError(f"env {env_id} does not render rgb_array frames (its render() returned {got})")
    if arr.dtype != np.uint8:
        arr = np.clip(arr, 0, 255).astype(np.uint8)
    return np.ascontiguousarray(arr[..., :3])


def _fit(frame: np.ndarray, h: int, w: int) -> np.ndarray:
    """`frame` cropped or padded with black to (h, w): a frame of another size than the first (a window
    resized mid-episode) still fits the stream."""
    if frame.shape[:2] == (h, w):
        return frame
    out = np.zeros((h, w, 3), np.uint8)
    fh, fw = min(h, frame.shape[0]), min(w, frame.shape[1])
    out[:fh, :fw] = frame[:fh, :fw]
    return out


class Mp4Writer:
    """Frames streamed into an H.264 mp4 (yuv420p, so any player opens it) at `path`, written to a temporary
    file and renamed into place by `close`; keeps small copies of the frames for a GIF. Frames are padded
    with black to even sizes (H.264 needs them), never resized."""

    def __init__(self, path: str, fps: float = 30.0, thumb_width: int = GIF_WIDTH):
        self.path, self.fps, self.thumb_width = os.path.abspath(path), float(fps), thumb_width
        self.frames, self.thumbs = 0, []
        self._writer = self._tmp = self._size = self._shown = None

    def _open(self, h: int, w: int) -> None:
        import imageio.v2 as iio

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd, self._tmp = tempfile.mkstemp(suffix=".mp4", dir=os.path.dirname(self.path))
        os.close(fd)
        self._size, self._shown = (h + h % 2, w + w % 2), (h, w)
        self._writer = iio.get_writer(self._tmp, format="FFMPEG", fps=self.fps, codec="libx264", macro_block_size=1,
                                      ffmpeg_log_level="error", pixelformat="yuv420p")

    def add(self, frame: np.ndarray) -> None:
        if self._writer is None:
            self._open(*frame.shape[:2])
        self._writer.append_data(_fit(frame[..., :3], *self._size))
        step = max(1, int(np.ceil(self._shown[1] / self.thumb_width)))
        self.thumbs.append(_fit(frame[..., :3], *self._shown)[::step, ::step].copy())
        self.frames += 1

    def close(self) -> str:
        """Finish the file and move it into place; VideoError when no frame was added."""
        if self._writer is None:
            raise VideoError(f"{self.path}: no frames to write")
        try:
            self._writer.close()
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(self._tmp, 0o666 & ~umask)  # mkstemp's file is private; a video is for sharing
            os.replace(self._tmp, self.path)
        finally:
            self._writer = None
            if os.path.exists(self._tmp):
                os.remove(self._tmp)
        return self.path

    def abort(self) -> None:
        """Drop a file being written (a failure mid-episode)."""
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001 - the file is discarded anyway
                pass
            self._writer = None
        if self._tmp and os.path.exists(self._tmp):
            os.remove(self._tmp)

    def gif(self, max_frames: int = GIF_MAX_FRAMES) -> tuple[bytes, int, int]:
        """(an animated GIF of the small copies, sampled evenly to at most `max_frames`, its height, width)."""
        import imageio.v3 as iio

        keep = np.unique(np.linspace(0, len(self.thumbs) - 1, min(len(self.thumbs), max_frames)).round().astype(int))
        small = np.stack([self.thumbs[i] for i in keep])
        duration_ms = 1000.0 * len(self.thumbs) / self.fps / len(keep)  # the episode's real length is kept
        return iio.imwrite("<bytes>", small, extension=".gif", duration=duration_ms, loop=0), small.shape[1], small.shape[2]


def write_mp4(path: str, frames: list[np.ndarray], fps: float = 30.0) -> str:
    """Write `frames` (each (H, W, 3) uint8) as an H.264 mp4 at `path`; returns the path."""
    writer = Mp4Writer(path, fps)
    try:
        for frame in frames:
            writer.add(frame)
        return writer.close()
    except BaseException:
        writer.abort()
        raise


def read_mp4(path: str, every: int = 1) -> tuple[list[np.ndarray], int, dict]:
    """(every `every`-th frame of an mp4 as (H, W, 3) uint8 arrays, how many frames it holds, the container's
    metadata: fps, codec, size): what a player decodes, for checking a video."""
    import imageio.v2 as iio

    reader = iio.get_reader(path, format="FFMPEG")
    frames, count = [], 0
    try:
        for frame in reader:
            if count % every == 0:
                frames.append(np.array(frame))  # a plain copy: imageio's Array subclass carries its metadata along
            count += 1
        meta = reader.get_meta_data()
    finally:
        reader.close()
    return frames, count, meta


def tensorboard_gif(writer, tag: str, gif: bytes, height: int, width: int, step: int) -> None:
    """Log an animated GIF to TensorBoard as an image summary (its image tab animates GIFs)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=gif)
    writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), global_step=step)
    writer.flush()


def fps_of(env) -> float:
    """The env's own frame rate (metadata render_fps), else 30."""
    fps = (getattr(env, "metadata", None) or {}).get("render_fps")
    try:
        return float(fps) if fps and float(fps) > 0 else 30.0
    except (TypeError, ValueError):
        return 30.0

