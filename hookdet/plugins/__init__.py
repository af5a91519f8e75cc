"""Plugins: the hooks and the machinery that calls them.

``hookspecs`` (every hook, specified), ``manager`` (the pluggy manager built from the plugin
selection), ``selection`` (the ``plugins:`` list and the launch, resolved once; the one place
built-in names live), ``options`` (declared plugin options), ``monitor`` (the one watch over hook
calls: errors and timing), ``default_hooks`` (hookdet's own last answers) and ``builtin/`` (the
built-in plugins, each replaceable). Plugin authors use :mod:`hookdet.plugin`, not these.
"""
