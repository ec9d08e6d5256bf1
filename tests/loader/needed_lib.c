/* A library a test plugin links and the dynamic loader cannot find (it is
 * in no folder it searches): the plugin is refused for it, listed or
 * loaded. */
int loader_test_needed(void);
int loader_test_needed(void)
{
    return 42;
}
