/* A program built outside the tree against an installed fiber. */
#include <fiber/fiber.h>
#include <stdio.h>
#include <string.h>

FIBER_TASK(triple)
{
    int v;
    if (len != sizeof v)
        return fiber_task_fail("want an int");
    memcpy(&v, arg, sizeof v);
    return 3 * v;
}

int main(int argc, char **argv)
{
    if (fiber_init(&argc, &argv) != 0) {
        fprintf(stderr, "fiber_init: %s\n", fiber_last_error());
        return 1;
    }
    int v = 14, code = -1;
    fiber_process *p;
    if (fiber_process_start(&p, "triple", &v, sizeof v, NULL) != 0 ||
        fiber_process_join(p, 30000) != 0 ||
        fiber_process_exitcode(p, &code) != 0) {
        fprintf(stderr, "process: %s\n", fiber_last_error());
        return 1;
    }
    fiber_process_free(p);
    printf("fiber %s: triple(14) = %d\n", fiber_version(), code);
    return code == 42 ? 0 : 1;
}
