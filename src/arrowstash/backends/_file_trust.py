"""Whether a cache folder can be trusted: only its owner (this user) can put files in it.

An entry whose loading runs code (a pickle) is as dangerous as a script, so a folder another
local user can write to, or one they own, must not be read as if this user had written it. The
File backend refuses such a folder unless a secret authenticates the entries (then it treats the
folder as shared: see docs/security.md).
"""

from __future__ import annotations

import os
import stat

from arrowstash.errors import BackendError


def folder_problem(path: str, st: os.stat_result) -> str | None:
    """Why the folder whose status is ``st`` lets someone else plant files, or None."""
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link inside the cache"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    if st.st_uid != os.geteuid():
        return f"{path} is owned by another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def refusal(problem: str) -> BackendError:
    """The error a File backend raises at first use of a folder it cannot trust."""
    return BackendError(
        f"untrusted cache folder: {problem}; another user could plant entries that run code "
        "when loaded. Make it private (owned by you, chmod 700) or, to share it on purpose, "
        "set a secret (ARROWSTASH_SECRET) so that every entry is authenticated"
    )


class FolderGuard:
    """Checks each folder of the cache once per process, when it is first used.

    Checking the root and every existing folder under it once is enough for a private cache:
    nobody else can create or replace anything below a folder only this user may write. A shared
    (untrusted) cache gets no such guarantee, so the backend resolves its paths without
    following links instead (``_file_io.open_beneath``).
    """

    def __init__(self, root: str, tolerate: bool) -> None:
        self.root = root
        #: Problems are remembered instead of raised (a secret authenticates the entries).
        self.tolerate = tolerate
        self.problem: str | None = None
        self._checked: set[str] = set()
        st = os.stat(root)  # the root may be reached through a link its owner made
        self._note(folder_problem(root, st))
        self._check_children(root)

    @property
    def trusted(self) -> bool:
        return self.problem is None

    def _note(self, problem: str | None) -> None:
        if problem is None:
            return
        if not self.tolerate:
            raise refusal(problem)
        self.problem = self.problem or problem

    def check(self, folder: str, children: bool) -> None:
        """Check ``folder`` (and, with ``children``, the folders in it) unless done already.

        A folder that does not exist yet passes: it can only be created by this user, through
        a parent already checked."""
        if folder in self._checked:
            return
        try:
            self._note(folder_problem(folder, os.lstat(folder)))
            if children:
                self._check_children(folder)
        except FileNotFoundError:
            return  # created later by this user: checked as a parent was
        except OSError as exc:
            raise BackendError(f"cannot check cache folder {folder}: {exc}") from exc
        self._checked.add(folder)

    def _check_children(self, folder: str) -> None:
        with os.scandir(folder) as listing:
            for item in listing:
                if item.is_symlink() or item.is_dir(follow_symlinks=False):
                    self._note(folder_problem(item.path, item.stat(follow_symlinks=False)))
