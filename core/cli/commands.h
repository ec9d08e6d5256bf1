/* loom CLI — one entry point per command (cli/cmd_<name>.c). */
#ifndef LOOM_CLI_COMMANDS_H
#define LOOM_CLI_COMMANDS_H

/* The exit status of a rank that failed because another rank did (a
 * checkpoint that failed elsewhere, a peer gone): `loom launch` waits a
 * moment for that rank's own exit before blaming this one. */
#define LOOM_EXIT_ANOTHER_RANK 75

int loom_cmd_plugins(int argc, char **argv);
int loom_cmd_launch(int argc, char **argv);
int loom_cmd_bench(int argc, char **argv);
int loom_cmd_ckpt(int argc, char **argv);
int loom_cmd_settings(int argc, char **argv);
int loom_cmd_train(int argc, char **argv);
int loom_cmd_sample(int argc, char **argv);
int loom_cmd_schedule(int argc, char **argv);

#endif
