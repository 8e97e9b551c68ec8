/*
 * replay.c: a plain main() for the fuzz harnesses, so that the saved
 * corpora and every crash ever found run as an ordinary test in every
 * build, with no fuzzer and no sanitizer needed.
 *
 * Usage: fuzz_replay_<harness> PATH...  Each PATH is a file or a directory
 * (read recursively; files named README* are skipped).  Each file is read
 * into a buffer of exactly its size, so a sanitizer build also sees reads
 * past the end, and handed to LLVMFuzzerTestOneInput().  A failed check
 * aborts; finding no input at all is an error too.
 */
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/fuzz/fuzz.h"

static size_t replayed;

static int replay_file(const char *path)
{
    FILE *fp = fopen(path, "rb");
    uint8_t *data;
    long size;

    if (fp == NULL || fseek(fp, 0, SEEK_END) != 0 || (size = ftell(fp)) < 0 ||
        fseek(fp, 0, SEEK_SET) != 0) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        if (fp != NULL)
            fclose(fp);
        return -1;
    }
    data = malloc(size > 0 ? (size_t)size : 1);
    if (data == NULL || fread(data, 1, (size_t)size, fp) != (size_t)size) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        free(data);
        fclose(fp);
        return -1;
    }
    fclose(fp);
    LLVMFuzzerTestOneInput(data, (size_t)size);
    free(data);
    replayed++;
    return 0;
}

static int replay_path(const char *path)
{
    struct stat st;
    DIR *dir;
    struct dirent *de;
    int rc = 0;

    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: no such file or directory: %s\n", path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode))
        return replay_file(path);
    if ((dir = opendir(path)) == NULL) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    while ((de = readdir(dir)) != NULL) {
        char child[4096];
        if (de->d_name[0] == '.' || strncmp(de->d_name, "README", 6) == 0)
            continue;
        if ((size_t)snprintf(child, sizeof(child), "%s/%s", path, de->d_name) >= sizeof(child)) {
            rc = -1;
            continue;
        }
        if (replay_path(child) != 0)
            rc = -1;
    }
    closedir(dir);
    return rc;
}

int main(int argc, char **argv)
{
    int rc = 0;

    for (int i = 1; i < argc; i++) {
        if (replay_path(argv[i]) != 0)
            rc = 1;
    }
    printf("replayed %zu inputs\n", replayed);
    if (replayed == 0)
        rc = 1;
    return rc;
}
