/* An LD_PRELOAD shim that injects storage faults into a real process at the libc boundary
 * (tests/log/test_storage_faults.py, tests/cluster): device-mapper error targets are not
 * available on the test machines (no dm driver in their kernels), so this is the real
 * mechanism closest to a
 * failing disk. Armed by files in the folder named by RIVERLOG_FAULT_DIR: when FILE exists
 * there, a call on a file whose path contains the text of FAULT_DIR/match fails with EIO:
 * "fsync" (fsync, fdatasync), "write" (pwrite, pwrite64, write), "read" (pread, pread64,
 * preadv, preadv64). Remove the file to disarm it. Build: cc -shared -fPIC -o iofault.so
 * iofault.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static int armed(const char *what, int fd) {
    const char *dir = getenv("RIVERLOG_FAULT_DIR");
    char path[4096], target[4096], match[1024];
    struct stat st;
    if (dir == NULL) return 0;
    snprintf(path, sizeof path, "%s/%s", dir, what);
    if (stat(path, &st) != 0) return 0;
    snprintf(path, sizeof path, "%s/match", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    size_t n = fread(match, 1, sizeof match - 1, f);
    fclose(f);
    match[n] = 0;
    while (n > 0 && (match[n - 1] == '\n' || match[n - 1] == ' ')) match[--n] = 0;
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(path, target, sizeof target - 1);
    if (len < 0) return 0;
    target[len] = 0;
    return n > 0 && strstr(target, match) != NULL;
}

#define FAIL_IF(what, fd) do { if (armed(what, fd)) { errno = EIO; return -1; } } while (0)
#define REAL(name) static __typeof__(name) *real; if (!real) real = dlsym(RTLD_NEXT, #name)

int fsync(int fd) { REAL(fsync); FAIL_IF("fsync", fd); return real(fd); }
int fdatasync(int fd) { REAL(fdatasync); FAIL_IF("fsync", fd); return real(fd); }
ssize_t pwrite(int fd, const void *b, size_t n, off_t o) {
    REAL(pwrite); FAIL_IF("write", fd); return real(fd, b, n, o); }
ssize_t pwrite64(int fd, const void *b, size_t n, off64_t o) {
    REAL(pwrite64); FAIL_IF("write", fd); return real(fd, b, n, o); }
ssize_t pread(int fd, void *b, size_t n, off_t o) {
    REAL(pread); FAIL_IF("read", fd); return real(fd, b, n, o); }
ssize_t pread64(int fd, void *b, size_t n, off64_t o) {
    REAL(pread64); FAIL_IF("read", fd); return real(fd, b, n, o); }
ssize_t preadv(int fd, const struct iovec *v, int c, off_t o) {
    REAL(preadv); FAIL_IF("read", fd); return real(fd, v, c, o); }
ssize_t preadv64(int fd, const struct iovec *v, int c, off64_t o) {
    REAL(preadv64); FAIL_IF("read", fd); return real(fd, v, c, o); }
