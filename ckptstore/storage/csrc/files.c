/* ckptstore.storage._files: a local store's file-system steps, each ONE call with the GIL
   released.

   Every os call of Python releases and takes back the GIL. A background persist writes a chunk
   file in four of them (open, writev, fsync, close), checks a new folder with a dozen lstat
   (os.path.realpath) and fsyncs a commit's folders in three per folder: beside a training loop
   that keeps the GIL busy, each take-back waits for the loop's switch interval (5 ms), so a
   256 MB persist spent seconds waiting (docs/lab/notebook.md, "A persist that asks for the GIL
   less"). Here each step is one call: the same system calls, in the same order, with the same
   errors (an OSError of the failing call's errno and path). ckptstore/storage/fileops.py holds
   the Python twins these must match, used where this extension is not built. */
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sync_file_range, syncfs */
#endif
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif
#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif
#ifndef O_DIRECTORY
#define O_DIRECTORY 0
#endif

/* A failed system call: its errno and the path it was about (NULL: the call's own path). */
typedef struct {
    int err;
    char *path; /* malloc-ed, or NULL */
} failure;

static void fail(failure *f, const char *path)
{
    f->err = errno;
    f->path = path ? strdup(path) : NULL;
}

/* Raise the OSError of `f` (about `f->path`, else `fallback`); frees f->path. */
static PyObject *raise_failure(failure *f, PyObject *fallback)
{
    PyObject *name = fallback;
    if (f->path) {
        name = PyUnicode_DecodeFSDefault(f->path);
        free(f->path);
        f->path = NULL;
        if (!name)
            return NULL;
    } else {
        Py_INCREF(name);
    }
    errno = f->err;
    PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, name);
    Py_DECREF(name);
    return NULL;
}

/* posixpath.dirname, in place: "/a/b" -> "/a", "/a" -> "/", "/" -> "/", "a" -> "". */
static void dirname_in_place(char *path)
{
    char *slash = strrchr(path, '/');
    if (!slash) {
        path[0] = '\0';
        return;
    }
    char *end = slash + 1; /* the head, with its trailing slashes stripped unless all slashes */
    int all_slashes = 1;
    for (char *c = path; c < end; c++)
        all_slashes &= *c == '/';
    if (!all_slashes)
        while (end[-1] == '/')
            end--;
    *end = '\0';
}

/* -- write_new -------------------------------------------------------------------------- */

/* Drop `done` written bytes from the front of iov[*first..count). */
static void advance(struct iovec *iov, int count, int *first, size_t done)
{
    while (*first < count && done >= iov[*first].iov_len) { /* drop what is written */
        done -= iov[*first].iov_len;
        (*first)++;
    }
    if (done) { /* cut into the next buffer */
        iov[*first].iov_base = (char *)iov[*first].iov_base + done;
        iov[*first].iov_len -= done;
    }
}

/* -- direct writes -------------------------------------------------------------------------

   A file whose pages are dropped once fsynced (a durable store's chunk) gains nothing from the
   page cache on its way to disk: its bytes are copied into new cache pages, written back and
   dropped, system time the persist pays on every commit (docs/benchmarks.md, "Chunk files past
   the page cache"). Where its first buffers start on a page (BytePlanes' output does), their
   page-aligned front is written with O_DIRECT straight from them instead, and only the rest
   (the body's last partial block, the crc) goes through the cache. Buffers that do not start
   on a page (a raw chunk of the snapshot, a quantized chunk's bytes) go through the cache as
   before: copying them into an aligned buffer first saved CPU on 7 MB chunks but cost more than
   it saved on a real state's 1 MB ones. Where the file system refuses O_DIRECT, or refuses a
   write of it, the rest is written as before. */
#define DIRECT_ALIGN 4096 /* any block size up to a page */

/* Write the DIRECT_ALIGN-aligned fronts of the buffers at the head of iov[*first..count) that
   start on a page to the new file `fd` with O_DIRECT (advancing *first and *written past
   them), then leave `fd` without O_DIRECT for the rest. A file system that refuses O_DIRECT, a
   short or refused direct write: the buffered writes that follow write the rest (and meet any
   real error again). 0, or -1 (errno) where O_DIRECT cannot be cleared again. */
static int write_direct(int fd, struct iovec *iov, int count, int *first, Py_ssize_t *written)
{
#ifdef O_DIRECT
    if (*first >= count || ((uintptr_t)iov[*first].iov_base & (DIRECT_ALIGN - 1))
        || iov[*first].iov_len < DIRECT_ALIGN)
        return 0; /* nothing in place: no direct write */
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_DIRECT) != 0)
        return 0; /* not on this file system */
    while (*first < count) {
        const struct iovec *v = &iov[*first];
        size_t piece = v->iov_len & ~(size_t)(DIRECT_ALIGN - 1);
        if (((uintptr_t)v->iov_base & (DIRECT_ALIGN - 1)) || !piece)
            break;
        ssize_t done = write(fd, v->iov_base, piece);
        if (done < 0 && errno == EINTR)
            continue;
        if (done <= 0)
            break;
        *written += done;
        advance(iov, count, first, (size_t)done);
        if ((size_t)done < piece)
            break; /* short: the offset may be unaligned now, the rest through the cache */
    }
    return fcntl(fd, F_SETFL, flags) == 0 ? 0 : -1;
#else
    return 0;
#endif
}

/* Whether the resolved path `resolved` is `root` or lies under it (Root.inside). */
static int inside(const char *resolved, const char *root)
{
    size_t n = strlen(root);
    while (n > 1 && root[n - 1] == '/')
        n--;
    if (strncmp(resolved, root, n) != 0)
        return 0;
    return resolved[n] == '\0' || resolved[n] == '/' || (n == 1 && root[0] == '/');
}

/* Whether `path` resolves (realpath) inside `root`; 0 where it does not or cannot resolve. */
static int resolves_inside(const char *path, const char *root)
{
    char *real = realpath(path, NULL);
    int ok = real && inside(real, root);
    free(real);
    return ok;
}

/* The most missing folders the one-call write makes above a file (an array's first chunk of a
   commit needs three: the array's, "c" and the chunk row's); more go the checked way. */
#define MAX_NEW_LEVELS 8

/* Make the folder of `path` and its missing parents (up to MAX_NEW_LEVELS in all): the nearest
   one that exists must resolve inside `root`, and so must the folder once made. 0 when made; 1
   when not (the folder there already, an ancestor outside, unresolvable or not a folder, too
   many missing): the caller takes the checked way; -1 on another failure of mkdir. */
static int make_folder_inside(const char *path, const char *root, failure *f)
{
    char *folder = strdup(path), *base = folder ? strdup(path) : NULL;
    int rc = 1, levels = 1;
    struct stat st;
    if (!folder || !base) {
        errno = ENOMEM;
        fail(f, NULL);
        rc = -1;
        goto out;
    }
    dirname_in_place(folder);
    strcpy(base, folder);
    for (;;) { /* up to the nearest ancestor that exists */
        dirname_in_place(base);
        if (lstat(base, &st) == 0)
            break;
        if (errno != ENOENT || levels >= MAX_NEW_LEVELS || base[0] == '\0'
            || strcmp(base, "/") == 0)
            goto out;
        levels++;
    }
    if (!resolves_inside(base, root))
        goto out;
    for (size_t i = strlen(base) + 1; levels > 1 && folder[i]; i++) { /* the parents, in order */
        if (folder[i] != '/')
            continue;
        folder[i] = '\0';
        int made = mkdir(folder, 0777) == 0 || errno == EEXIST; /* EEXIST: made meanwhile */
        if (!made)
            fail(f, folder);
        folder[i] = '/';
        if (!made) {
            rc = -1;
            goto out;
        }
    }
    if (mkdir(folder, 0777) != 0) {
        if (errno != EEXIST) {
            fail(f, folder);
            rc = -1;
        }
        goto out;
    }
    rc = resolves_inside(folder, root) ? 0 : 1; /* nothing swapped a link in meanwhile */
out:
    free(folder);
    free(base);
    return rc;
}

/* What write_new makes durable: nothing; the file (fsync: its data, its inode, and on the
   usual journaling file systems the journal they are in); or its data only, written out and
   waited for (sync_file_range), with the inode and its folder's entry left for one syncfs of
   the whole commit (sync_store): a commit's hundreds of files then cost one journal commit and
   one device cache flush instead of one each. */
#define SYNC_NONE 0
#define SYNC_FILE 1
#define SYNC_WRITEOUT 2

/* Write out `fd`'s dirty pages and wait for them (no metadata, no device flush). */
static int writeout(int fd)
{
#ifdef SYNC_FILE_RANGE_WRITE
    for (;;) {
        if (sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE
                                          | SYNC_FILE_RANGE_WAIT_AFTER) == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno == ENOSYS || errno == EINVAL || errno == ESPIPE)
            return fdatasync(fd); /* not here: the data, durably */
        return -1;
    }
#else
    return fdatasync(fd);
#endif
}

/* Create `path` anew (unlinking one there first, as LocalStorage's _create_anew), write every
   buffer in order (writev, short writes finished), fsync when asked, close; with `root`, make
   its folder first (make_folder_inside). 1: not written (the caller takes the checked way). */
static int write_new_nogil(const char *path, struct iovec *iov, int count, int sync,
                           int drop, int direct, const char *root, Py_ssize_t *written,
                           failure *f)
{
    int fd = -1;
    if (root) {
        int made = make_folder_inside(path, root, f);
        if (made != 0)
            return made;
    }
    for (int attempt = 0; attempt <= 100 && fd < 0; attempt++) {
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0)
            break;
        if (errno == EINTR)
            continue;
        if (errno != EEXIST || attempt == 100) {
            fail(f, NULL);
            return -1;
        }
        if (unlink(path) != 0 && errno != ENOENT) { /* another writer unlinked it first */
            /* Python's twin lets only FileNotFoundError pass; anything else is raised */
            fail(f, NULL);
            return -1;
        }
    }
    int first = 0;
    if (sync && drop && direct && write_direct(fd, iov, count, &first, written) != 0) {
        fail(f, NULL);
        close(fd);
        return -1;
    }
    while (first < count) {
        int n = count - first < IOV_MAX ? count - first : IOV_MAX;
        ssize_t done = writev(fd, iov + first, n);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            fail(f, NULL);
            close(fd);
            return -1;
        }
        *written += done;
        advance(iov, count, &first, (size_t)done);
    }
    if (sync == SYNC_FILE && fsync(fd) != 0) {
        fail(f, NULL);
        close(fd);
        return -1;
    }
    if (sync == SYNC_WRITEOUT && writeout(fd) != 0) {
        fail(f, NULL);
        close(fd);
        return -1;
    }
#ifdef POSIX_FADV_DONTNEED
    if (sync && drop) /* its pages are clean now: out of the page cache (advice only) */
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
#endif
    if (close(fd) != 0 && errno != EINTR) {
        fail(f, NULL);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(write_new_doc,
"write_new(path, parts, fsync, inside=None, drop=False, direct=False) -> int\n\n"
"A new file at ``path`` holding the byte buffers ``parts`` in order (a file there is unlinked\n"
"first), made durable as ``fsync`` says: 0 not, 1 fsynced, 2 its data written out and waited\n"
"for (sync_file_range; its inode and name left for a sync_store); with ``drop`` too, its pages\n"
"advised out of the page cache once on disk (POSIX_FADV_DONTNEED), and with ``direct`` as\n"
"well, the page-aligned front of the\n"
"buffers that start on a page written past the cache (O_DIRECT) where the file system takes\n"
"it; the bytes written. ``inside`` (a store root's resolved path): make the file's folder\n"
"and its missing parents first, the nearest that exists and the folder checked to resolve\n"
"inside; where the folder is there already or a check fails, nothing is written and -1 comes\n"
"back. One call with the GIL released.");

static PyObject *write_new(PyObject *self, PyObject *args)
{
    PyObject *path_obj = NULL, *parts, *inside_obj = Py_None, *root_obj = NULL;
    int sync, drop = 0, direct = 0;
    if (!PyArg_ParseTuple(args, "O&Oi|Opp:write_new", PyUnicode_FSConverter, &path_obj, &parts,
                          &sync, &inside_obj, &drop, &direct))
        return NULL;
    if (sync < SYNC_NONE || sync > SYNC_WRITEOUT) {
        PyErr_SetString(PyExc_ValueError, "write_new: fsync is 0, 1 or 2");
        Py_DECREF(path_obj);
        return NULL;
    }
    if (inside_obj != Py_None && !PyUnicode_FSConverter(inside_obj, &root_obj)) {
        Py_DECREF(path_obj);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(parts, "write_new: parts must be a sequence of buffers");
    if (!seq) {
        Py_DECREF(path_obj);
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count > INT_MAX / 2) {
        PyErr_SetString(PyExc_ValueError, "write_new: too many buffers");
        Py_DECREF(seq);
        Py_DECREF(path_obj);
        return NULL;
    }
    Py_buffer *views = PyMem_Calloc(count ? (size_t)count : 1, sizeof(Py_buffer));
    struct iovec *iov = PyMem_Calloc(count ? (size_t)count : 1, sizeof(struct iovec));
    Py_ssize_t held = 0;
    PyObject *out = NULL;
    if (!views || !iov) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < count; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &views[held],
                               PyBUF_C_CONTIGUOUS) != 0)
            goto done;
        iov[held].iov_base = views[held].buf;
        iov[held].iov_len = (size_t)views[held].len;
    }
    const char *path = PyBytes_AS_STRING(path_obj);
    const char *root = root_obj ? PyBytes_AS_STRING(root_obj) : NULL;
    Py_ssize_t written = 0;
    failure f = {0, NULL};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = write_new_nogil(path, iov, (int)count, sync, drop, direct, root, &written, &f);
    Py_END_ALLOW_THREADS
    if (rc > 0) {
        out = PyLong_FromLong(-1);
        goto done;
    }
    if (rc != 0) {
        PyObject *name = PyUnicode_DecodeFSDefault(path);
        if (name) {
            raise_failure(&f, name);
            Py_DECREF(name);
        }
        free(f.path);
        goto done;
    }
    out = PyLong_FromSsize_t(written);
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(iov);
    Py_DECREF(seq);
    Py_DECREF(path_obj);
    Py_XDECREF(root_obj);
    return out;
}

/* -- resolve_existing ------------------------------------------------------------------- */

PyDoc_STRVAR(resolve_existing_doc,
"resolve_existing(path, stop) -> (str, str | None) | None\n\n"
"The nearest of ``path`` and its ancestors that exists (``os.path.lexists``), going up no\n"
"further than ``stop`` or ``/`` (None when none exists up to there), and its resolved path\n"
"(``realpath``; None where realpath fails: a dangling link or a loop, which the caller\n"
"resolves as ``os.path.realpath`` does). One call with the GIL released.");

static PyObject *resolve_existing(PyObject *self, PyObject *args)
{
    PyObject *path_obj = NULL, *stop_obj = NULL;
    if (!PyArg_ParseTuple(args, "O&O&:resolve_existing", PyUnicode_FSConverter, &path_obj,
                          PyUnicode_FSConverter, &stop_obj))
        return NULL;
    char *probe = strdup(PyBytes_AS_STRING(path_obj));
    char *parent = probe ? strdup(probe) : NULL;
    const char *stop = PyBytes_AS_STRING(stop_obj);
    char *resolved = NULL;
    int found = 0;
    if (!probe || !parent) {
        free(probe);
        free(parent);
        Py_DECREF(path_obj);
        Py_DECREF(stop_obj);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    struct stat st;
    for (;;) {
        if (lstat(probe, &st) == 0) {
            found = 1;
            break;
        }
        strcpy(parent, probe);
        dirname_in_place(parent);
        if (strcmp(probe, stop) == 0 || strcmp(parent, probe) == 0)
            break;
        strcpy(probe, parent);
    }
    if (found)
        resolved = realpath(probe, NULL);
    Py_END_ALLOW_THREADS
    PyObject *out;
    if (!found) {
        out = Py_NewRef(Py_None);
    } else {
        PyObject *where = PyUnicode_DecodeFSDefault(probe);
        PyObject *real = resolved ? PyUnicode_DecodeFSDefault(resolved) : Py_NewRef(Py_None);
        out = where && real ? PyTuple_Pack(2, where, real) : NULL;
        Py_XDECREF(where);
        Py_XDECREF(real);
    }
    free(resolved);
    free(probe);
    free(parent);
    Py_DECREF(path_obj);
    Py_DECREF(stop_obj);
    return out;
}

/* -- make_folders ----------------------------------------------------------------------- */

PyDoc_STRVAR(make_folders_doc,
"make_folders(path) -> list[str]\n\n"
"Make the folder ``path`` and its missing parents (``os.mkdir``, parents first; one another\n"
"writer made meanwhile is passed over); the folders made. One call with the GIL released.");

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static PyObject *make_folders(PyObject *self, PyObject *args)
{
    PyObject *path_obj = NULL;
    if (!PyArg_ParseTuple(args, "O&:make_folders", PyUnicode_FSConverter, &path_obj))
        return NULL;
    const char *path = PyBytes_AS_STRING(path_obj);
    size_t len = strlen(path);
    /* the missing folders are prefixes of `path`: their lengths, deepest first */
    size_t *missing = PyMem_Malloc((len + 1) * sizeof(size_t));
    char *made = PyMem_Calloc(len + 1, 1);      /* made[k]: the prefix of length k was made */
    char *probe = PyMem_Malloc(len + 1);
    if (!missing || !made || !probe) {
        PyMem_Free(missing);
        PyMem_Free(made);
        PyMem_Free(probe);
        Py_DECREF(path_obj);
        return PyErr_NoMemory();
    }
    size_t nmissing = 0;
    failure f = {0, NULL};
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    memcpy(probe, path, len + 1);
    for (;;) {
        if (is_dir(probe))
            break;
        size_t here = strlen(probe);
        dirname_in_place(probe);
        if (strlen(probe) == here)
            break; /* the top: dirname(probe) == probe */
        missing[nmissing++] = here;
    }
    for (size_t i = nmissing; i-- > 0;) {
        memcpy(probe, path, missing[i]);
        probe[missing[i]] = '\0';
        if (mkdir(probe, 0777) == 0) {
            made[missing[i]] = 1;
        } else if (errno != EEXIST) { /* another writer made it; a file there fails later */
            fail(&f, probe);
            rc = -1;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (rc != 0) {
        raise_failure(&f, path_obj);
    } else if ((out = PyList_New(0))) {
        for (size_t i = nmissing; i-- > 0;) {
            if (!made[missing[i]])
                continue;
            PyObject *name = PyUnicode_DecodeFSDefaultAndSize(path, (Py_ssize_t)missing[i]);
            if (!name || PyList_Append(out, name) != 0) {
                Py_XDECREF(name);
                Py_CLEAR(out);
                break;
            }
            Py_DECREF(name);
        }
    }
    PyMem_Free(missing);
    PyMem_Free(made);
    PyMem_Free(probe);
    Py_DECREF(path_obj);
    return out;
}

/* -- fsync_tree ------------------------------------------------------------------------- */

/* A growing list of malloc-ed paths. */
typedef struct {
    char **items;
    size_t count, room;
} paths;

static int paths_add(paths *p, const char *path)
{
    if (p->count == p->room) {
        size_t room = p->room ? 2 * p->room : 16;
        char **items = realloc(p->items, room * sizeof(char *));
        if (!items)
            return -1;
        p->items = items;
        p->room = room;
    }
    if (!(p->items[p->count] = strdup(path)))
        return -1;
    p->count++;
    return 0;
}

static void paths_free(paths *p)
{
    for (size_t i = 0; i < p->count; i++)
        free(p->items[i]);
    free(p->items);
}

/* Fsync what `path` opened with `flags` names; a missing one has nothing to make durable. */
static int fsync_opened(const char *path, int flags, failure *f)
{
    int fd = open(path, flags | O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        fail(f, path);
        return -1;
    }
    if (fsync(fd) != 0) {
        fail(f, path);
        close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

/* Fsync a folder's entries. */
static int fsync_folder(const char *path, failure *f)
{
    return fsync_opened(path, O_DIRECTORY, f);
}

/* Fsync a file's data and inode (never through a link, never waiting on a FIFO). */
static int fsync_file(const char *path, failure *f)
{
    return fsync_opened(path, O_NOFOLLOW | O_NONBLOCK, f);
}

/* Fsync each folder above `path` (a writable copy, consumed) up to `root`; with `skip`, only
   those on another device than it (what its syncfs did not reach). */
static int fsync_above(char *path, const char *root, const struct stat *skip, failure *f)
{
    struct stat above;
    while (strcmp(path, root) != 0) {
        size_t here = strlen(path);
        dirname_in_place(path);
        if (strlen(path) == here)
            return 0;
        if (skip && stat(path, &above) != 0) {
            fail(f, path);
            return -1;
        }
        if ((!skip || above.st_dev != skip->st_dev) && fsync_folder(path, f) != 0)
            return -1;
    }
    return 0;
}

/* Every folder under `top` (itself first), links not followed, folders that cannot be listed
   not entered (as os.walk); with `files`, every regular file in them too. */
static int list_folders(const char *top, paths *out, paths *files)
{
    if (paths_add(out, top) != 0)
        return -1;
    for (size_t i = 0; i < out->count; i++) {
        DIR *dir = opendir(out->items[i]);
        if (!dir)
            continue;
        struct dirent *e;
        char *base = out->items[i];
        size_t blen = strlen(base);
        while ((e = readdir(dir))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            size_t nlen = strlen(e->d_name);
            char *child = malloc(blen + nlen + 2);
            if (!child) {
                closedir(dir);
                return -1;
            }
            memcpy(child, base, blen);
            child[blen] = '/';
            memcpy(child + blen + 1, e->d_name, nlen + 1);
            int folder = e->d_type == DT_DIR, regular = e->d_type == DT_REG;
            if (e->d_type == DT_UNKNOWN) {
                struct stat st;
                int known = lstat(child, &st) == 0;
                folder = known && S_ISDIR(st.st_mode);
                regular = known && S_ISREG(st.st_mode);
            }
            int rc = folder ? paths_add(out, child) : 0;
            if (rc == 0 && regular && files)
                rc = paths_add(files, child);
            free(child);
            base = out->items[i]; /* the list may have moved */
            if (rc != 0) {
                closedir(dir);
                return -1;
            }
        }
        closedir(dir);
    }
    return 0;
}

PyDoc_STRVAR(fsync_tree_doc,
"fsync_tree(path, root, files=False) -> None\n\n"
"Fsync every folder under ``path`` (itself included, links not followed, the deepest first),\n"
"then each folder above it up to ``root``; with ``files``, every regular file under ``path``\n"
"first. One call with the GIL released.");

static PyObject *fsync_tree(PyObject *self, PyObject *args)
{
    PyObject *path_obj = NULL, *root_obj = NULL;
    int with_files = 0;
    if (!PyArg_ParseTuple(args, "O&O&|p:fsync_tree", PyUnicode_FSConverter, &path_obj,
                          PyUnicode_FSConverter, &root_obj, &with_files))
        return NULL;
    const char *path = PyBytes_AS_STRING(path_obj), *root = PyBytes_AS_STRING(root_obj);
    paths folders = {NULL, 0, 0}, files = {NULL, 0, 0};
    failure f = {0, NULL};
    int rc = 0, nomem = 0;
    char *up = strdup(path);
    Py_BEGIN_ALLOW_THREADS
    if (!up || list_folders(path, &folders, with_files ? &files : NULL) != 0) {
        nomem = 1;
        rc = -1;
    }
    for (size_t i = 0; rc == 0 && i < files.count; i++)
        rc = fsync_file(files.items[i], &f);
    for (size_t i = folders.count; rc == 0 && i-- > 0;) /* a folder's children come after it */
        rc = fsync_folder(folders.items[i], &f);
    if (rc == 0)
        rc = fsync_above(up, root, NULL, &f);
    Py_END_ALLOW_THREADS
    free(up);
    paths_free(&folders);
    paths_free(&files);
    PyObject *out = NULL;
    if (nomem)
        PyErr_NoMemory();
    else if (rc != 0)
        raise_failure(&f, path_obj);
    else
        out = Py_NewRef(Py_None);
    Py_DECREF(path_obj);
    Py_DECREF(root_obj);
    return out;
}

/* -- batched durability ------------------------------------------------------------------

   A durable commit used to fsync each of its files and folders: a MiniLM commit, about 250
   chunk files and 360 folders, made some 620 journal commits and device cache flushes, each a
   wait and a trip through the hypervisor's block device, about a tenth of the persist's CPU
   (docs/benchmarks.md, "Batched durability"). On the file systems below, syncfs makes every
   file's data and inode and every folder's entries durable at once (the journal's commit and
   one cache flush; git's core.fsyncMethod=batch is the same idea with a final fsync): the
   chunk files are written out (SYNC_WRITEOUT: their pages clean, so they can be dropped) and
   the commit's folder is synced once. Elsewhere each file and folder is fsynced as before:
   network and FUSE file systems, whose syncfs may not reach the server, and overlayfs, whose
   files have no pages of their own for sync_file_range to write out and whose syncfs reached
   the upper file system only from Linux 4.18. (ckptstore/storage/fileops.py adds the kernel:
   5.8 or later, where syncfs reports writeback errors.) */
#ifdef __linux__
#include <sys/vfs.h>
static int batch_magic(long type)
{
    switch ((unsigned long)type & 0xffffffffUL) {
    case 0xEF53UL:     /* ext2, ext3, ext4 */
    case 0x58465342UL: /* xfs */
    case 0x9123683EUL: /* btrfs */
    case 0xF2F52010UL: /* f2fs */
    case 0x01021994UL: /* tmpfs (nothing to make durable) */
        return 1;
    default:
        return 0;
    }
}

/* Whether `path`'s file system takes batched durability; 0 where statfs fails. */
static int on_batch_fs(const char *path)
{
    struct statfs st;
    return statfs(path, &st) == 0 && batch_magic((long)st.f_type);
}
#endif

PyDoc_STRVAR(batch_fs_doc,
"batch_fs(path) -> bool\n\n"
"Whether the file system that holds ``path`` (which must exist) is one where one ``syncfs``\n"
"makes every file and folder written on it durable (ext2-4, xfs, btrfs, f2fs, tmpfs); False\n"
"elsewhere and where this system has no ``syncfs``.");

static PyObject *batch_fs(PyObject *self, PyObject *args)
{
    PyObject *path_obj = NULL;
    if (!PyArg_ParseTuple(args, "O&:batch_fs", PyUnicode_FSConverter, &path_obj))
        return NULL;
    int ok = 0;
#ifdef __linux__
    const char *path = PyBytes_AS_STRING(path_obj);
    Py_BEGIN_ALLOW_THREADS
    ok = on_batch_fs(path);
    Py_END_ALLOW_THREADS
#endif
    Py_DECREF(path_obj);
    return PyBool_FromLong(ok);
}

PyDoc_STRVAR(sync_store_doc,
"sync_store(path, root) -> bool\n\n"
"Make the folder ``path`` and everything under it durable at once: ``syncfs`` of its file\n"
"system (every file's data and inode, every folder's entries, written by anyone), then an\n"
"fsync of each folder above it up to ``root`` that lies on another file system. False, with\n"
"nothing done, where that file system is not one of ``batch_fs``'s or this system has no\n"
"``syncfs``: the caller fsyncs each file and folder. One call with the GIL released.");

static PyObject *sync_store(PyObject *self, PyObject *args)
{
    PyObject *path_obj = NULL, *root_obj = NULL;
    if (!PyArg_ParseTuple(args, "O&O&:sync_store", PyUnicode_FSConverter, &path_obj,
                          PyUnicode_FSConverter, &root_obj))
        return NULL;
#ifdef __linux__
    const char *path = PyBytes_AS_STRING(path_obj), *root = PyBytes_AS_STRING(root_obj);
    failure f = {0, NULL};
    int rc = 0, synced = 0;
    char *up = strdup(path);
    Py_BEGIN_ALLOW_THREADS
    struct stat st;
    int fd = -1;
    if (!up) {
        errno = ENOMEM;
        fail(&f, NULL);
        rc = -1;
    } else if ((fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
        struct statfs fs;
        if (fstatfs(fd, &fs) == 0 && batch_magic((long)fs.f_type)) {
            if (fstat(fd, &st) != 0 || syncfs(fd) != 0) {
                fail(&f, NULL);
                rc = -1;
            } else {
                synced = 1;
            }
        }
        close(fd);
    } else if (errno != ENOENT && errno != ENOTDIR) { /* missing: nothing synced, False */
        fail(&f, NULL);
        rc = -1;
    }
    if (synced && rc == 0) /* the folders above it on another device */
        rc = fsync_above(up, root, &st, &f);
    Py_END_ALLOW_THREADS
    free(up);
    PyObject *out = rc == 0 ? PyBool_FromLong(synced) : raise_failure(&f, path_obj);
    Py_DECREF(path_obj);
    Py_DECREF(root_obj);
    return out;
#else
    Py_DECREF(path_obj);
    Py_DECREF(root_obj);
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"write_new", write_new, METH_VARARGS, write_new_doc},
    {"resolve_existing", resolve_existing, METH_VARARGS, resolve_existing_doc},
    {"make_folders", make_folders, METH_VARARGS, make_folders_doc},
    {"fsync_tree", fsync_tree, METH_VARARGS, fsync_tree_doc},
    {"sync_store", sync_store, METH_VARARGS, sync_store_doc},
    {"batch_fs", batch_fs, METH_VARARGS, batch_fs_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "ckptstore.storage._files",
    "A local store's file-system steps, each one call with the GIL released.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__files(void) { return PyModule_Create(&module); }
